/**
 * A handler that is slow, not dead: it never returns, or waits on a lock another session
 * holds. It held its chunk's transaction, the inbox rows it locked and its partition for good
 * (the partition's next owner blocks on those rows too). With `handlerTimeoutMs` the
 * transaction is rolled back at the deadline, the message is tried again and dead-lettered,
 * the partition moves on, and the call, when it wakes, can no longer write with the
 * transaction it was given.
 */
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HandlerTimeoutError } from '../../consumers/handlerDeadline.js';
import {
  createInboxConsumer,
  type InboxConsumer,
  type InboxConsumerOptions,
  type InboxHandler,
} from '../../consumers/inboxConsumer.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { produceTo, uuid } from './fixtures.js';

let tdb: TestDatabase;
beforeAll(async () => {
  tdb = await createTestDatabase('inbox_handler_timeout');
  await sql`CREATE TABLE seen (seq int NOT NULL)`.execute(tdb.db);
  await sql`CREATE TABLE counter (id int PRIMARY KEY, n int NOT NULL)`.execute(tdb.db);
  await sql`INSERT INTO counter VALUES (1, 0)`.execute(tdb.db);
});
afterAll(async () => {
  await tdb?.drop();
});

const seen = async () =>
  (await sql<{ seq: number }>`SELECT seq FROM seen ORDER BY seq`.execute(tdb.db)).rows.map((r) => r.seq);

async function withConsumer(
  topic: string,
  o: Pick<InboxConsumerOptions, 'handler' | 'handlerTimeoutMs' | 'maxAttempts'> & {
    sessionTimeoutMs?: number;
  },
  fn: (consumer: InboxConsumer) => Promise<void>,
): Promise<void> {
  const groupId = `${topic}.g`;
  const consumer = createInboxConsumer({
    db: tdb.db,
    groupId,
    subscriber: createKafkaSubscriber({
      brokers: kafkaBrokers(),
      groupId,
      topics: [topic],
      ...(o.sessionTimeoutMs && { sessionTimeoutMs: o.sessionTimeoutMs }),
    }),
    dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
    handler: o.handler,
    ...(o.handlerTimeoutMs && { handlerTimeoutMs: o.handlerTimeoutMs }),
    maxAttempts: o.maxAttempts ?? 2,
    retryBaseMs: 20,
    retryMaxMs: 50,
  });
  const running = consumer.run();
  try {
    await fn(consumer);
  } finally {
    await consumer.stop();
    await running.catch(() => {});
  }
}

const seqs = (topic: string, list: number[], ids: Record<number, string> = {}) =>
  produceTo(
    topic,
    list.map((seq) => ({
      key: 'k',
      value: JSON.stringify({ seq }),
      headers: { 'cairn-message-id': ids[seq] ?? uuid() },
    })),
  );

describe('handlerTimeoutMs', () => {
  it('a handler that never returns: rolled back at the deadline, tried again, dead-lettered; the next messages are applied; the call, woken, writes nothing', async () => {
    const topic = await createTestTopic('inbox-handler-hangs', 1);
    const hungId = uuid();
    await seqs(topic, [1, 2, 3], { 2: hungId });
    const wake: Array<() => void> = [];
    const afterWaking: Array<Promise<unknown>> = [];
    const handler: InboxHandler = async (trx, m) => {
      const { seq } = m.json<{ seq: number }>();
      await sql`INSERT INTO seen (seq) VALUES (${seq})`.execute(trx);
      if (seq !== 2) return;
      await new Promise<void>((r) => wake.push(r)); // never returns until the test says so
      const late = sql`INSERT INTO seen (seq) VALUES (22)`.execute(trx);
      afterWaking.push(
        late.then(
          () => 'written',
          (e: unknown) => e,
        ),
      );
      await late;
    };
    await withConsumer(topic, { handler, handlerTimeoutMs: 300, maxAttempts: 2 }, async (consumer) => {
      await waitFor(
        'seq 3 applied after seq 2 was dead-lettered',
        () => consumer.stats().applied === 2 && consumer.stats().deadLettered === 1,
        30_000,
      );
      expect(await seen()).toEqual([1, 3]);
      const dlq = await tdb.db
        .selectFrom('inbox_dlq')
        .select(['message_id', 'error'])
        .where('consumer_group', '=', `${topic}.g`)
        .execute();
      expect(dlq).toEqual([
        {
          message_id: hungId,
          error: expect.stringMatching(/did not finish message .+ within 300 ms \(handlerTimeoutMs\)/),
        },
      ]);
      // Each timed-out call (the chunk's, then each attempt alone) wakes and writes: refused.
      expect(wake.length).toBeGreaterThanOrEqual(2);
      for (const w of wake) w();
      await waitFor('each woken call to try its write', () => afterWaking.length === wake.length, 10_000);
      const outcomes = await Promise.all(afterWaking);
      for (const o of outcomes) {
        expect(o).toBeInstanceOf(HandlerTimeoutError);
        expect((o as HandlerTimeoutError).code).toBe('handler_timeout');
      }
      expect(await seen()).toEqual([1, 3]);
    });
  });

  it('a handler waiting on a lock another session holds: the statement ends at the deadline, the transaction is rolled back, and once the lock is gone the message is applied once', async () => {
    const topic = await createTestTopic('inbox-handler-lock', 1);
    await seqs(topic, [5]);
    const holder = new pg.Client({ connectionString: tdb.url });
    await holder.connect();
    const { rows: at } = await sql<{ schema: string }>`SELECT current_schema() AS schema`.execute(tdb.db);
    await holder.query(`SET search_path TO "${at[0]!.schema}"`);
    try {
      await holder.query('BEGIN');
      await holder.query('SELECT n FROM counter WHERE id = 1 FOR UPDATE');
      let calls = 0;
      const handler: InboxHandler = async (trx) => {
        calls++;
        await sql`UPDATE counter SET n = n + 1 WHERE id = 1`.execute(trx);
      };
      await withConsumer(topic, { handler, handlerTimeoutMs: 400, maxAttempts: 50 }, async (consumer) => {
        try {
          // Without a bound on the statement, the rollback waited behind the blocked UPDATE: no retry ever began.
          await waitFor('two attempts timed out and a third began', () => calls >= 3, 20_000);
          expect(consumer.stats().applied).toBe(0);
        } finally {
          await holder.query('COMMIT'); // else a failure here would leave the consumer's stop waiting on the lock
        }
        await waitFor('the message applied', () => consumer.stats().applied === 1, 30_000);
        const { rows } = await sql<{ n: number }>`SELECT n FROM counter WHERE id = 1`.execute(tdb.db);
        expect(rows[0]!.n).toBe(1); // the timed-out attempts' updates were rolled back
        expect(consumer.stats().deadLettered).toBe(0);
      });
    } finally {
      await holder.end();
    }
  });

  it('a handler slower than the session timeout, within its deadline, keeps the partition: applied once, its offset committed, no rebalance', async () => {
    const topic = await createTestTopic('inbox-handler-slow', 1);
    await seqs(topic, [7, 8]);
    const handler: InboxHandler = async (trx, m) => {
      const { seq } = m.json<{ seq: number }>();
      if (seq === 7) await new Promise((r) => setTimeout(r, 9000)); // past the 6 s session
      await sql`INSERT INTO seen (seq) VALUES (${seq})`.execute(trx);
    };
    await withConsumer(
      topic,
      { handler, handlerTimeoutMs: 20_000, sessionTimeoutMs: 6000 },
      async (consumer) => {
        await waitFor('both applied', () => consumer.stats().applied === 2, 40_000);
        expect(consumer.stats().offsetCommitFailures).toBe(0);
        expect(consumer.stats().duplicates).toBe(0);
        expect((await seen()).filter((s) => s >= 7)).toEqual([7, 8]);
      },
    );
  }, 60_000);
});
