// Review (an outage at start is waited for): the relay waits for Postgres to answer a ping,
// then seeds its lanes. A session ended between the two (a server restart, 57P01) makes run()
// reject: `cairn relay` exits 1 ("failed") instead of waiting as it does for an outage found
// by the ping itself.
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createRelay } from '../../relay/relay.js';
import { createDb, type Db } from '../../src/db/database.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
let relayDb: Db;
beforeAll(async () => {
  t = await createTestDatabase('relay_start_outage');
  relayDb = createDb({ connectionString: t.url, max: 4, applicationName: 'review-relay' });
});
afterAll(async () => {
  await relayDb?.destroy();
  await t?.drop();
});

it('a session terminated while the lanes are seeded: the relay waits and runs, it does not die', async () => {
  const relay = createRelay({ db: relayDb, publisher: createKafkaPublisher({ brokers: kafkaBrokers() }) });
  let failed: unknown;
  await t.db.connection().execute(async (conn) => {
    await sql`BEGIN`.execute(conn);
    await sql`LOCK TABLE relay_lane IN ACCESS EXCLUSIVE MODE`.execute(conn);
    const running = relay.run().then(
      () => undefined,
      (err: unknown) => {
        failed = err;
      },
    );
    void running;
    let terminated = 0;
    const deadline = Date.now() + 30_000;
    while (terminated === 0 && Date.now() < deadline) {
      const r = await sql<{ n: number }>`
        SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
         WHERE application_name = 'review-relay' AND wait_event_type = 'Lock'`.execute(t.db);
      terminated = r.rows[0]!.n;
      if (terminated === 0) await new Promise((x) => setTimeout(x, 20));
    }
    expect(terminated).toBe(1);
    await sql`ROLLBACK`.execute(conn);
  });
  try {
    // Postgres answers again at once: the relay must be running and own its lanes.
    const until = Date.now() + 20_000;
    while (Date.now() < until && failed === undefined && relay.stats().lanesOwned === 0)
      await new Promise((x) => setTimeout(x, 100));
    expect((failed as Error | undefined)?.message).toBeUndefined();
    expect(relay.stats().lanesOwned).toBeGreaterThan(0);
  } finally {
    await relay.stop().catch(() => {});
  }
});
