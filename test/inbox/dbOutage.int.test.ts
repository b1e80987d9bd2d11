// An inbox consumer whose Postgres goes away (a restart, a network cut) is facing an outage,
// not a bad message: no message may be dead-lettered for it, however long it lasts, and the
// consumer says what it waits for. Before, a failed chunk's one-by-one pass counted each
// refused connection as one of the message's attempts: a cut of a second or two spent all of
// them, and once Postgres answered again the healthy message was dead-lettered.
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import type { Db } from '../../src/db/database.js';
import { dbBehindProxy, type TcpProxy } from '../support/tcpProxy.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { oneTopicOf, onTestBroker } from './fixtures.js';

let t: TestDatabase;
let proxy: TcpProxy;
/** The consumer's database: the test database behind a proxy the test can cut. */
let cutDb: Db;
let behind: Awaited<ReturnType<typeof dbBehindProxy>>;

beforeAll(async () => {
  t = await createTestDatabase('inbox_db_outage');
  await sql`CREATE TABLE effects (message_id text PRIMARY KEY)`.execute(t.db);
  behind = await dbBehindProxy(t.url);
  ({ db: cutDb, proxy } = behind);
});
afterAll(async () => {
  await behind?.close();
  await t?.drop();
});

async function effects(): Promise<string[]> {
  const r = await t.db
    .selectFrom('effects' as never)
    .select('message_id' as never)
    .execute();
  return (r as { message_id: string }[]).map((x) => x.message_id).sort();
}

async function deadLetters(): Promise<number> {
  const r = await sql<{ n: number }>`SELECT count(*)::int AS n FROM inbox_dlq`.execute(t.db);
  return r.rows[0]!.n;
}

/**
 * A consumer of a 3-message topic whose handler cuts Postgres the first time it sees message
 * m0, inside the chunk's transaction; `restoreAfter` refused connections later the proxy lets
 * connections through again.
 */
async function cutWhileApplying(label: string, restoreAfter: number) {
  const topic = await oneTopicOf(label, 3);
  const group = `${topic}.g`;
  let cut = false;
  const consumer = createInboxConsumer({
    db: cutDb,
    groupId: group,
    ...onTestBroker(group, topic),
    maxAttempts: 3,
    retryBaseMs: 10,
    handler: async (trx, m) => {
      const value = m.value?.toString() ?? '';
      if (value === 'm0' && !cut) {
        cut = true;
        proxy.cut((n) => {
          if (n >= restoreAfter) proxy.restore();
        });
      }
      await sql`INSERT INTO effects (message_id) VALUES (${value})`.execute(trx);
    },
  });
  return { consumer };
}

it('a cut shorter than the retries dead-letters nothing: the messages are applied once Postgres answers', async () => {
  // Three refused connections: as many as the message's attempts were.
  const { consumer } = await cutWhileApplying('db-cut-short', 3);
  void consumer.run();
  try {
    // Ends early on a dead letter: the failure this test is about.
    await waitFor(
      'all three applied (or one dead-lettered)',
      async () => (await effects()).length === 3 || (await deadLetters()) > 0,
      60_000,
    );
    expect(await effects()).toEqual(['m0', 'm1', 'm2']);
    expect(consumer.stats().deadLettered).toBe(0);
    expect(await deadLetters()).toBe(0);
  } finally {
    await consumer.stop();
  }
});

it('a longer cut: the consumer says it waits for postgres, then applies every message once', async () => {
  await sql`TRUNCATE effects`.execute(t.db);
  const { consumer } = await cutWhileApplying('db-cut-long', 5);
  void consumer.run();
  let waited = false;
  try {
    await waitFor(
      'all three applied',
      async () => {
        if (consumer.waitingFor() === 'postgres') waited = true;
        return (await effects()).length === 3;
      },
      90_000,
    );
    expect(waited).toBe(true);
    expect(await effects()).toEqual(['m0', 'm1', 'm2']);
    expect(consumer.stats().deadLettered).toBe(0);
    expect(await deadLetters()).toBe(0);
    expect(consumer.waitingFor()).toBe(null);
  } finally {
    await consumer.stop();
  }
});

it("a handler's own refused connection (Postgres answers) is the message's failure: dead-lettered after its attempts", async () => {
  const topic = await oneTopicOf('db-up-handler-refused', 1);
  const group = `${topic}.g`;
  let calls = 0;
  const consumer = createInboxConsumer({
    db: cutDb,
    groupId: group,
    ...onTestBroker(group, topic),
    maxAttempts: 3,
    retryBaseMs: 10,
    handler: async () => {
      calls++;
      throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:9 (the payments service)'), {
        code: 'ECONNREFUSED',
      });
    },
  });
  void consumer.run();
  try {
    await waitFor('the message dead-lettered', () => consumer.stats().deadLettered === 1, 60_000);
    // The chunk, then its three attempts alone.
    expect(calls).toBe(4);
    expect(consumer.waitingFor()).toBe(null);
  } finally {
    await consumer.stop();
  }
});
