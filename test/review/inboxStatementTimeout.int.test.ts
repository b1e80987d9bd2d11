// Review (a database that is slow is not a bad message): with a statement timeout set on the
// consumer's pool, Postgres stalling for some seconds (a lock held by a migration or a
// maintenance job, an I/O stall) fails every attempt with 57014; the consumer counts them,
// since only a connection loss is asked of the database, and dead-letters healthy messages
// within ~1.5 s of retries.
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { createDb, type Db } from '../../src/db/database.js';
import { oneTopicOf, onTestBroker } from '../inbox/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

let t: TestDatabase;
let slowDb: Db;
beforeAll(async () => {
  t = await createTestDatabase('inbox_stmt_timeout');
  await sql`CREATE TABLE effects (message_id text PRIMARY KEY)`.execute(t.db);
  slowDb = createDb({ connectionString: t.url, max: 4, statementTimeoutMillis: 300 });
});
afterAll(async () => {
  await slowDb?.destroy();
  await t?.drop();
});

it('Postgres stalled for 15 s (statement timeouts) dead-letters nothing', async () => {
  const topic = await oneTopicOf('stmt-timeout', 2);
  const group = `${topic}.g`;
  const consumer = createInboxConsumer({
    db: slowDb,
    groupId: group,
    ...onTestBroker(group, topic),
    handler: async (trx, m) => {
      await sql`INSERT INTO effects VALUES (${m.value?.toString() ?? ''})`.execute(trx);
    },
  });
  await t.db.connection().execute(async (conn) => {
    await sql`BEGIN`.execute(conn);
    await sql`LOCK TABLE effects IN ACCESS EXCLUSIVE MODE`.execute(conn);
    void consumer.run();
    // Held for 15 s, or until the consumer has given a message up (what this test is about).
    const until = Date.now() + 15_000;
    while (Date.now() < until && consumer.stats().deadLettered === 0)
      await new Promise((r) => setTimeout(r, 100));
    await sql`ROLLBACK`.execute(conn);
  });
  try {
    await waitFor(
      'both messages applied or dead-lettered',
      async () => {
        const r = await sql<{ n: number }>`
          SELECT (SELECT count(*) FROM effects) + (SELECT count(*) FROM inbox_dlq) AS n`.execute(t.db);
        return Number(r.rows[0]!.n) >= 2;
      },
      60_000,
    );
    expect(consumer.stats().deadLettered).toBe(0);
  } finally {
    await consumer.stop();
  }
});
