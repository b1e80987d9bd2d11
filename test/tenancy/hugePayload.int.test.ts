import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRelay } from '../../relay/relay.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { laneOf } from '../../src/outbox/lanes.js';
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
 * The library refuses a payload over its limit at enqueue, but a tenant's own INSERT into
 * outbox takes any bytea (up to 1 GB). The relay's claim always keeps the first row whatever
 * its size ("the first row always"), and node-postgres receives a bytea as hex text: a payload
 * past ~268 MB is a string longer than V8 allows. The claim fails every time, and with it every
 * lane of the relay.
 */
let tdb: TestDatabase;
let topic: string;
const outbox = createOutbox();

beforeAll(async () => {
  tdb = await createTestDatabase('adv3_huge_payload');
  topic = await createTestTopic('adv3-huge-payload', 1);
});
afterAll(async () => {
  await tdb?.drop();
});

describe("a tenant's own outbox row with a huge payload", () => {
  it("is refused at insert; another tenant's messages flow", async () => {
    const { app, asA, asB } = await twoTenants(tdb, 2);
    // Before migration 0015, 300 MiB of one byte (stored compressed, tiny) reached the relay as
    // 600 MiB of hex and its claim never settled. Now anything over 64 MiB is refused at insert.
    await expect(
      sql`INSERT INTO outbox (lane, message_id, topic, key, payload)
          VALUES (${laneOf('big')}, gen_random_uuid(), ${topic}, 'big',
                  decode(repeat('ab', 64 * 1024 * 1024 + 1), 'hex'))`.execute(asA),
    ).rejects.toThrow(/outbox_payload_size/);
    await asB.transaction().execute((t) => outbox.enqueue(t, [{ topic, key: 'b1', payload: { n: 1 } }]));
    const relay = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      instanceId: 'r1',
    });
    const run = relay.run();
    try {
      await waitFor(
        "tenant B's message to be published",
        async () =>
          (await tdb.db.selectFrom('outbox').select('id').where('tenant_id', '=', 'tenant-b').execute())
            .length === 0,
        30_000,
      );
      expect(relay.stats().published).toBeGreaterThanOrEqual(1);
    } finally {
      await relay.stop();
      await run;
      await app.destroy();
    }
  });
});
