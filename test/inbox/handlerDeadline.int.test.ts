// A handler that does not finish, and rows another consumer holds (review findings):
// - a hung handler held its chunk's transaction, with the inbox rows of the whole chunk, for
//   good: no deadline, no heartbeat, and the partition's next owner blocked on those rows;
// - a consumer blocked on inbox rows another (hung or paused) consumer holds waited on the
//   unique index forever: it could neither heartbeat nor notice that its partition moved.
import { setTimeout as sleep } from 'node:timers/promises';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import type { ReceivedBatch, Subscriber } from '../../src/kafka/subscriber.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { nowherePublisher, stubMessages } from './fixtures.js';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase('inbox_handler_deadline');
  await sql`CREATE TABLE effects (id bigserial PRIMARY KEY, message_id text NOT NULL)`.execute(t.db);
});
afterAll(async () => {
  await t?.drop();
});

/** A subscriber whose batches the test hands in itself (`deliver`), recording offset commits. */
function handDelivered() {
  let eachBatch!: (b: ReceivedBatch) => Promise<void>;
  const commits: string[] = [];
  const subscriber: Subscriber = {
    async run(f) {
      eachBatch = f;
    },
    waiting: () => false,
    commit: async (_t, _p, next) => {
      commits.push(next);
    },
    stop: async () => {},
  };
  const deliver = (b: Partial<ReceivedBatch> & Pick<ReceivedBatch, 'messages'>) =>
    eachBatch({
      topic: 't',
      partition: 0,
      isActive: () => true,
      heartbeat: async () => {},
      resolveOffset: () => {},
      ...b,
    });
  return { subscriber, commits, deliver };
}

async function effectsOf(): Promise<Record<string, number>> {
  const { rows } = await sql<{ message_id: string; n: number }>`
    SELECT message_id, count(*)::int AS n FROM effects GROUP BY message_id ORDER BY message_id`.execute(t.db);
  return Object.fromEntries(rows.map((r) => [r.message_id, r.n]));
}

it('a hung handler is abandoned at handlerTimeoutMs: its chunk rolls back, the others apply once, it is dead-lettered after maxAttempts runs, it sees the abort, and writes nothing after it', async () => {
  const { subscriber, commits, deliver } = handDelivered();
  let runs = 0;
  let aborts = 0;
  const consumer = createInboxConsumer({
    db: t.db,
    groupId: 'hung',
    subscriber,
    dlqPublisher: nowherePublisher,
    maxAttempts: 2,
    retryBaseMs: 10,
    handlerTimeoutMs: 500,
    handler: async (trx, m, { signal }) => {
      await sql`INSERT INTO effects (message_id) VALUES (${m.messageId})`.execute(trx);
      if (m.messageId !== 'hung-1') return;
      runs++;
      // Hangs until abandoned, then (like a handler that ignores the signal too late) tries
      // to write once more with the transaction it was given.
      await new Promise<void>((r) => signal.addEventListener('abort', () => r(), { once: true }));
      aborts++;
      await sleep(50);
      await sql`INSERT INTO effects (message_id) VALUES ('late')`.execute(trx).catch(() => {});
    },
  });
  await consumer.run();
  const batch = deliver({ messages: stubMessages('hung', 3) });
  await waitFor(
    'the batch to end',
    async () => (await Promise.race([batch.then(() => true), sleep(100)])) === true,
    30_000,
  );
  await consumer.stop();
  const idle = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM pg_stat_activity
     WHERE datname = current_database() AND state LIKE 'idle in transaction%'`.execute(t.db);
  const inbox = await t.db
    .selectFrom('inbox')
    .select(['message_id', 'outcome'])
    .where('consumer_group', '=', 'hung')
    .orderBy('message_id')
    .execute();
  expect({
    effects: await effectsOf(),
    runs,
    aborts,
    deadLettered: consumer.stats().deadLettered,
    applied: consumer.stats().applied,
    lastCommit: commits.at(-1),
    idleInTransaction: idle.rows[0]!.n,
    inbox,
  }).toEqual({
    effects: { 'hung-0': 1, 'hung-2': 1 }, // and no 'late'
    runs: 2, // maxAttempts, the run in the chunk counted as the first
    aborts: 2,
    deadLettered: 1,
    applied: 2,
    lastCommit: '3',
    idleInTransaction: 0,
    inbox: [
      { message_id: 'hung-0', outcome: 'applied' },
      { message_id: 'hung-1', outcome: 'dead_lettered' },
      { message_id: 'hung-2', outcome: 'applied' },
    ],
  });
}, 60_000);

it('a consumer blocked on inbox rows another transaction holds hands the batch back when its partition moves, spends no attempt, and applies the messages once they are released', async () => {
  const { subscriber, commits, deliver } = handDelivered();
  const consumer = createInboxConsumer({
    db: t.db,
    groupId: 'blocked',
    subscriber,
    dlqPublisher: nowherePublisher,
    maxAttempts: 1, // one counted failure would dead-letter it
    handler: async (trx, m) => {
      await sql`INSERT INTO effects (message_id) VALUES (${m.messageId})`.execute(trx);
    },
  });
  await consumer.run();
  // The partition's previous owner, hung (or SIGSTOPped) with its chunk's inbox rows inserted.
  const holder = await t.db.startTransaction().execute();
  await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", key)
            VALUES ('blocked', 'blocked-1', 't', 0, 1, 'k')`.execute(holder);
  let active = true;
  let beats = 0;
  let returned = false;
  const batch = deliver({
    messages: stubMessages('blocked', 3),
    isActive: () => active,
    heartbeat: async () => {
      beats++;
    },
  }).finally(() => {
    returned = true;
  });
  await waitFor(
    'the consumer to wait on the held row',
    async () => {
      const { rows } = await sql<{ n: number }>`
        SELECT count(*)::int AS n FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'`.execute(t.db);
      return rows[0]!.n > 0;
    },
    10_000,
  );
  // The group moves the partition while the row is still held.
  active = false;
  let returnedWhileHeld = false;
  try {
    await waitFor('the batch to be handed back', () => returned, 20_000);
    returnedWhileHeld = true;
  } catch {
    // still blocked: the assertion below says so
  }
  const beatsWhileHeld = beats;
  await holder.rollback().execute();
  await batch;
  // The partition comes back: the same messages are applied, each once.
  await deliver({ messages: stubMessages('blocked', 3) });
  await consumer.stop();
  const { rows } = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM effects WHERE message_id LIKE 'blocked-%'`.execute(t.db);
  expect({
    returnedWhileHeld,
    heartbeatsWhileBlocked: beatsWhileHeld > 0,
    effects: rows[0]!.n,
    deadLettered: consumer.stats().deadLettered,
    applied: consumer.stats().applied,
    lastCommit: commits.at(-1),
  }).toEqual({
    returnedWhileHeld: true,
    heartbeatsWhileBlocked: true,
    effects: 3,
    deadLettered: 0,
    applied: 3,
    lastCommit: '3',
  });
}, 60_000);
