import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRelay } from '../../relay/relay.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, createTestTopic, kafkaBrokers, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

/**
 * A tenant's role has DELETE on its own outbox rows. A DELETE left open in a transaction holds
 * the row's lock; the relay's fenced delete of that (published) row waits for it with no
 * timeout, while holding FOR SHARE on every lane it owns. Every later batch waits for that
 * delete, the lanes are never renewed, and no other relay can take them (SKIP LOCKED skips
 * the share-locked lane rows): every tenant's messages stop.
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

describe("a tenant's open DELETE of its own outbox row", () => {
  it("does not stop the relay for another tenant's messages", async () => {
    const { app, asA, asB } = await twoTenants(tdb, 3);
    const [a1] = await asA.transaction().execute((t) => outbox.enqueue(t, [{ topic, key: 'a', payload: { n: 1 } }]));
    // Tenant A: delete its own row in a transaction it never ends.
    let end!: () => void;
    const ended = new Promise<void>((r) => {
      end = r;
    });
    let locked!: () => void;
    const isLocked = new Promise<void>((r) => {
      locked = r;
    });
    const holder = asA.connection().execute(async (c) => {
      await sql`BEGIN`.execute(c);
      await sql`DELETE FROM outbox WHERE message_id = ${a1}`.execute(c);
      locked();
      await ended;
      await sql`ROLLBACK`.execute(c);
    });
    await isLocked;
    const relays = ['r1', 'r2'].map((instanceId) =>
      createRelay({
        db: tdb.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        instanceId,
        leaseTtlMs: 1000,
      }),
    );
    const runs = [relays[0]!.run()];
    const published = () => relays.reduce((n, r) => n + r.stats().published, 0);
    try {
      await waitFor('the first batch', () => published() >= 1, 20_000);
      if (process.env.ADV3_CONTROL) end();
      runs.push(relays[1]!.run()); // a second relay, ready to take over lanes
      // Tenant B goes on enqueueing; each message must reach the broker.
      for (const n of [1, 2, 3, 4]) {
        await asB.transaction().execute((t) => outbox.enqueue(t, [{ topic, key: `b${n}`, payload: { n } }]));
        const before = n; // a1 + b1..b(n-1) at least
        await waitFor(`tenant B's message ${n} to be published`, () => published() >= before + 1, 15_000);
      }
      const left = await tdb.db.selectFrom('outbox').select('key').where('tenant_id', '=', 'tenant-b').execute();
      await waitFor('tenant B rows deleted', async () =>
        (await tdb.db.selectFrom('outbox').select('key').where('tenant_id', '=', 'tenant-b').execute()).length === 0,
        15_000,
      );
      expect(left.length).toBeGreaterThanOrEqual(0);
    } finally {
      end();
      await holder.catch(() => {});
      for (const r of relays) await r.stop();
      await Promise.all(runs);
      await app.destroy();
    }
  });
});
