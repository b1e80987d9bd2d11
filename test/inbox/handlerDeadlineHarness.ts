/**
 * What test/inbox/handlerDeadline*.int share: a database with an `effect` table and a `locked`
 * row, and a consumer over one fresh topic with an 800 ms handler deadline and two attempts.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll } from 'vitest';
import {
  type createInboxConsumer,
  createInboxConsumerWithTestHooks,
  type InboxHandler,
} from '../../consumers/inboxConsumer.js';
import type { InboxConsumerOptions, InboxTestHooks } from '../../consumers/inboxTypes.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { produceTo, uuid } from './fixtures.js';

type Stats = () => ReturnType<ReturnType<typeof createInboxConsumer>['stats']>;

export interface DeadlineHarness {
  /** The test database (set in beforeAll). */
  readonly tdb: TestDatabase;
  /** Runs a consumer of `seqs` (one key, each with a message id) through `fn`, then stops it. */
  withConsumer(
    seqs: number[],
    handler: InboxHandler,
    fn: (stats: Stats, groupId: string) => Promise<void>,
    hooks?: InboxTestHooks,
    extra?: Partial<InboxConsumerOptions>,
  ): Promise<void>;
  /** What handlers wrote for `seq`, sorted. */
  effects(seq: number): Promise<string[]>;
}

export const seqOf = (m: { json<T>(): T }) => m.json<{ seq: number }>().seq;

/** A handler whose first call never returns; every later call records `attempt N` for its seq. */
export function hangsOnce(): { handler: InboxHandler; calls: () => number } {
  let calls = 0;
  const handler: InboxHandler = async (trx, m) => {
    const attempt = ++calls;
    if (attempt === 1) await new Promise(() => {}); // never
    await sql`INSERT INTO effect VALUES (${seqOf(m)}, ${`attempt ${attempt}`})`.execute(trx);
  };
  return { handler, calls: () => calls };
}

/** Registers the database's beforeAll/afterAll for the calling test file. */
export function deadlineHarness(name: string): DeadlineHarness {
  let tdb: TestDatabase | undefined;
  beforeAll(async () => {
    tdb = await createTestDatabase(name);
    await sql`CREATE TABLE effect (seq int NOT NULL, what text NOT NULL)`.execute(tdb.db);
    await sql`CREATE TABLE locked (id int PRIMARY KEY, n int NOT NULL)`.execute(tdb.db);
    await sql`INSERT INTO locked VALUES (1, 0)`.execute(tdb.db);
  });
  afterAll(async () => {
    await tdb?.drop();
  });
  const db = () => {
    if (tdb === undefined) throw new Error('the deadline harness is used before its beforeAll');
    return tdb;
  };
  return {
    get tdb() {
      return db();
    },
    async withConsumer(seqs, handler, fn, hooks = {}, extra = {}) {
      const topic = await createTestTopic('inbox-handler-deadline', 1);
      await produceTo(
        topic,
        seqs.map((seq) => ({
          key: 'k',
          value: JSON.stringify({ seq }),
          headers: { 'cairn-message-id': uuid() },
        })),
      );
      const groupId = `${topic}.g`;
      const consumer = createInboxConsumerWithTestHooks(
        {
          db: db().db,
          groupId,
          subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId, topics: [topic] }),
          dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
          handler,
          handlerTimeoutMs: 800,
          maxAttempts: 2,
          retryBaseMs: 10,
          ...extra,
        },
        hooks,
      );
      const running = consumer.run();
      try {
        await fn(() => consumer.stats(), groupId);
      } finally {
        await consumer.stop();
        await running.catch(() => {});
      }
    },
    async effects(seq) {
      const { rows } = await sql<{
        what: string;
      }>`SELECT what FROM effect WHERE seq = ${seq} ORDER BY what`.execute(db().db);
      return rows.map((r) => r.what);
    },
  };
}
