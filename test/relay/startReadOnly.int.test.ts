/**
 * adversary5: fd26f7f made the relay's start one step (ping, seed lanes, WAL slot) and waits
 * only for a connection loss; anything else is StartupRefused (isFinal) and run() rejects.
 * A relay (re)started during a failover, against the standby not yet promoted (read-only,
 * 25006 on the lane seeding INSERT), dies instead of waiting: `cairn relay` exits 1 (not 75),
 * where the inbox consumer, for the same 25006, waits (c42234d). Expected: the relay waits
 * (stats().waitingFor 'postgres') and runs once the server takes writes.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createRelay } from '../../relay/relay.js';
import { createDb, type Db } from '../../src/db/database.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
let relayDb: Db;
beforeAll(async () => {
  t = await createTestDatabase('adv5_relay_ro');
  relayDb = createDb({ connectionString: t.url, max: 4, applicationName: 'adv5-relay' });
});
afterAll(async () => {
  await relayDb?.destroy();
  await sql`ALTER DATABASE ${sql.id(t.name)} RESET default_transaction_read_only`
    .execute(t.db)
    .catch(() => {});
  await t?.drop();
});

it('a relay started on a server that does not take writes yet waits for it; it does not die', async () => {
  // The standby being promoted: it answers, and refuses writes (25006).
  await sql`ALTER DATABASE ${sql.id(t.name)} SET default_transaction_read_only = on`.execute(t.db);
  const relay = createRelay({ db: relayDb, publisher: createKafkaPublisher({ brokers: kafkaBrokers() }) });
  let failed: unknown;
  void relay.run().catch((err: unknown) => {
    failed = err;
  });
  try {
    await new Promise((r) => setTimeout(r, 3000));
    expect({
      failed: (failed as Error | undefined)?.message,
      waitingFor: relay.stats().waitingFor,
    }).toEqual({ failed: undefined, waitingFor: 'postgres' });
  } finally {
    await relay.stop().catch(() => {});
  }
});
