import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRelay } from '../../relay/relay.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { twoTenants } from '../support/tenants.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

/**
 * Review finding (tenant adversary): a tenant's role had DELETE on its own outbox rows. A
 * DELETE left open in a transaction held the row's lock; the relay's fenced delete of that
 * (published) row waited for it with no timeout, while holding FOR SHARE on every lane it owns:
 * the lanes were never renewed, no other relay could take them, and every tenant's messages
 * stopped. Migration 0015 takes DELETE away (UPDATE went in 0008): no row lock either.
 */
let tdb: TestDatabase;
let topic: string;
const outbox = createOutbox();

beforeAll(async () => {
  tdb = await createTestDatabase('adv3_relay_lock');
  topic = await createTestTopic('adv3-relay-lock', 1);
});
afterAll(async () => {
  await tdb?.drop();
});

describe("a tenant's own outbox rows", () => {
  it('cannot be deleted nor locked by the tenant: the relay never waits for its lock, and every message flows', async () => {
    const { app, asA, asB } = await twoTenants(tdb, 3);
    const [a1] = await asA
      .transaction()
      .execute((t) => outbox.enqueue(t, [{ topic, key: 'a', payload: { n: 1 } }]));
    const attempts = [
      sql`DELETE FROM outbox WHERE message_id = ${a1}`,
      sql`SELECT 1 FROM outbox WHERE message_id = ${a1} FOR UPDATE`,
      sql`SELECT 1 FROM outbox WHERE message_id = ${a1} FOR NO KEY UPDATE`,
      sql`SELECT 1 FROM outbox WHERE message_id = ${a1} FOR SHARE`,
      sql`SELECT 1 FROM outbox WHERE message_id = ${a1} FOR KEY SHARE`,
    ];
    for (const q of attempts)
      await expect(asA.transaction().execute((t) => q.execute(t))).rejects.toThrow(/permission denied/);
    await asB.transaction().execute((t) => outbox.enqueue(t, [{ topic, key: 'b', payload: { n: 1 } }]));
    const relay = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      instanceId: 'r1',
      leaseTtlMs: 1000,
    });
    const run = relay.run();
    try {
      await waitFor(
        "both tenants' messages published and deleted",
        async () => (await tdb.db.selectFrom('outbox').select('id').execute()).length === 0,
        20_000,
      );
      expect(relay.stats().published).toBe(2);
    } finally {
      await relay.stop();
      await run;
      await app.destroy();
    }
  });
});
