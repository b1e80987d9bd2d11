/**
 * A handler that never returns (a call to another service that never answers, a statement
 * waiting on a lock) held its partition for good: the consumer heartbeats while a handler runs,
 * so no rebalance moved it either. `handlerTimeoutMs` bounds a transaction of handlers: past it,
 * the transaction's Postgres session is ended (consumers/handlerDeadline.ts), the message is
 * tried again and dead-lettered after its attempts, and the partition moves on.
 *
 * A deadline must not open a worse hole: a handler past it may still be running and may still
 * write through its `trx`. Those writes must land nowhere: not in its transaction (which must
 * not commit), not after the rollback in autocommit, not on a connection the pool gave to
 * another transaction (review of an earlier version, reverted: a rollback alone let a queued
 * write through).
 */
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HandlerTimeoutError } from '../../consumers/handlerDeadline.js';
import {
  createInboxConsumer,
  createInboxConsumerWithTestHooks,
  type InboxHandler,
} from '../../consumers/inboxConsumer.js';
import type { InboxConsumerOptions, InboxTestHooks } from '../../consumers/inboxTypes.js';
import { createDb } from '../../src/db/database.js';
import { ValidationError } from '../../src/errors.js';
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
  tdb = await createTestDatabase('inbox_handler_deadline');
  await sql`CREATE TABLE effect (seq int NOT NULL, what text NOT NULL)`.execute(tdb.db);
  await sql`CREATE TABLE locked (id int PRIMARY KEY, n int NOT NULL)`.execute(tdb.db);
  await sql`INSERT INTO locked VALUES (1, 0)`.execute(tdb.db);
});
afterAll(async () => {
  await tdb?.drop();
});

async function withConsumer(
  seqs: number[],
  handler: InboxHandler,
  fn: (
    stats: () => ReturnType<ReturnType<typeof createInboxConsumer>['stats']>,
    groupId: string,
  ) => Promise<void>,
  hooks: InboxTestHooks = {},
  extra: Partial<InboxConsumerOptions> = {},
): Promise<void> {
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
      db: tdb.db,
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
}

const effects = async (seq: number) =>
  (
    await sql<{ what: string }>`SELECT what FROM effect WHERE seq = ${seq} ORDER BY what`.execute(tdb.db)
  ).rows.map((r) => r.what);
const seqOf = (m: { json<T>(): T }) => m.json<{ seq: number }>().seq;

describe('an inbox handler past handlerTimeoutMs', () => {
  it('one that never returns is tried again, then dead-lettered with the deadline named; the partition moves on', async () => {
    const handler: InboxHandler = async (trx, m) => {
      const seq = seqOf(m);
      if (seq === 1) await new Promise(() => {}); // never
      await sql`INSERT INTO effect VALUES (${seq}, 'applied')`.execute(trx);
    };
    await withConsumer([1, 2], handler, async (stats, groupId) => {
      await waitFor(
        'one applied, one dead-lettered',
        () => stats().applied === 1 && stats().deadLettered === 1,
        30_000,
      );
      expect(stats().retries).toBe(1);
      expect(await effects(1)).toEqual([]);
      expect(await effects(2)).toEqual(['applied']);
      const [letter] = await tdb.db
        .selectFrom('inbox_dlq')
        .select(['error', 'attempts'])
        .where('consumer_group', '=', groupId)
        .execute();
      expect(letter).toMatchObject({ attempts: 2 });
      expect(letter!.error).toMatch(/did not finish within 800 ms \(handlerTimeoutMs\)/);
    });
  }, 60_000);

  it('one that wakes after its deadline and writes through its trx writes nothing, in its transaction or after it; the next attempt applies once', async () => {
    const late: unknown[] = [];
    let calls = 0;
    const handler: InboxHandler = async (trx, m) => {
      const seq = seqOf(m);
      const attempt = ++calls;
      await sql`INSERT INTO effect VALUES (${seq}, ${`attempt ${attempt}: before`})`.execute(trx);
      if (attempt === 1) {
        await new Promise((r) => setTimeout(r, 2000)); // a pause past the 800 ms deadline
        try {
          await sql`INSERT INTO effect VALUES (${seq}, 'attempt 1: after its deadline')`.execute(trx);
          late.push('written');
        } catch (err) {
          late.push(err);
        }
        return;
      }
      await sql`INSERT INTO effect VALUES (${seq}, ${`attempt ${attempt}: after`})`.execute(trx);
    };
    await withConsumer([11], handler, async (stats) => {
      await waitFor('applied', () => stats().applied === 1, 30_000);
      await waitFor('the first attempt woke and wrote', () => late.length === 1, 10_000);
      expect(late[0]).not.toBe('written');
      expect(await effects(11)).toEqual(['attempt 2: after', 'attempt 2: before']);
      expect(stats().deadLettered).toBe(0);
    });
  }, 60_000);

  it('one whose statement runs past its deadline and writes the moment it returns writes nothing (the write would follow the rollback on the same connection, in autocommit)', async () => {
    const late: unknown[] = [];
    let calls = 0;
    const handler: InboxHandler = async (trx, m) => {
      const seq = seqOf(m);
      const attempt = ++calls;
      if (attempt === 1) {
        try {
          await sql`SELECT pg_sleep(1.5)`.execute(trx); // past the 800 ms deadline
          await sql`INSERT INTO effect VALUES (${seq}, 'attempt 1: after its deadline')`.execute(trx);
          late.push('written');
        } catch (err) {
          late.push(err);
        }
        return;
      }
      await sql`INSERT INTO effect VALUES (${seq}, ${`attempt ${attempt}`})`.execute(trx);
    };
    await withConsumer([15], handler, async (stats) => {
      await waitFor('applied', () => stats().applied === 1, 30_000);
      await waitFor('the first attempt ended', () => late.length === 1, 10_000);
      await new Promise((r) => setTimeout(r, 1500)); // past the first attempt's pg_sleep
      expect(late[0]).not.toBe('written');
      expect(await effects(15)).toEqual(['attempt 2']);
    });
  }, 60_000);

  it('one waiting on a lock is ended (its statement with it) and applied once the lock is free', async () => {
    // Another session holds the row the handler updates.
    const holder = new pg.Client({ connectionString: tdb.url });
    holder.on('error', () => {}); // ended with the database, should the test fail first
    await holder.connect();
    const { rows: at } = await sql<{ schema: string }>`SELECT current_schema() AS schema`.execute(tdb.db);
    await holder.query('BEGIN');
    await holder.query(`SELECT n FROM ${at[0]!.schema}.locked WHERE id = 1 FOR UPDATE`);
    let calls = 0;
    const handler: InboxHandler = async (trx) => {
      calls++;
      await sql`UPDATE locked SET n = n + 1 WHERE id = 1`.execute(trx);
    };
    await withConsumer([21], handler, async (stats) => {
      await waitFor('the first attempt ended', () => stats().retries === 1, 20_000);
      await holder.query('COMMIT');
      await holder.end();
      await waitFor('applied', () => stats().applied === 1, 20_000);
      const { rows } = await sql<{ n: number }>`SELECT n FROM locked WHERE id = 1`.execute(tdb.db);
      expect(rows[0]!.n).toBe(1);
      expect(calls).toBeGreaterThanOrEqual(2);
    });
  }, 60_000);

  it('one that finishes between its deadline and the end of its session (a hook there) does not commit: its message is tried again', async () => {
    let calls = 0;
    let release: (() => void) | undefined;
    const finished: number[] = [];
    const handler: InboxHandler = async (trx, m) => {
      const seq = seqOf(m);
      const attempt = ++calls;
      if (attempt === 1) await new Promise<void>((r) => (release = r));
      await sql`INSERT INTO effect VALUES (${seq}, ${`attempt ${attempt}`})`.execute(trx);
      finished.push(attempt);
    };
    const hooks: InboxTestHooks = {
      async beforeTerminate() {
        // The deadline passed; the handler now finishes its work before its session is ended.
        release?.();
        await waitFor('the first attempt finished', () => finished.includes(1), 5000);
      },
    };
    await withConsumer(
      [31],
      handler,
      async (stats) => {
        await waitFor('applied', () => stats().applied === 1, 30_000);
        // Its chunk failed at the deadline, and the message alone went at once (no retry counted).
        expect(calls).toBe(2);
        expect(await effects(31)).toEqual(['attempt 2']);
      },
      hooks,
    );
  }, 60_000);

  // Review: a session already gone at the deadline (an idle-in-transaction timeout, a DBA's
  // kill) made the termination find nothing, and the consumer waited for the handler for good.
  it('one whose session ended by itself before its deadline ran out is tried again (its connection error, not a wait)', async () => {
    let calls = 0;
    const handler: InboxHandler = async (trx, m) => {
      const attempt = ++calls;
      if (attempt === 1) await new Promise(() => {}); // never
      await sql`INSERT INTO effect VALUES (${seqOf(m)}, ${`attempt ${attempt}`})`.execute(trx);
    };
    const hooks: InboxTestHooks = {
      async beforeTerminate(pid) {
        if (calls === 1) await sql`SELECT pg_terminate_backend(${pid}::int, 5000)`.execute(tdb.db);
      },
    };
    await withConsumer(
      [41],
      handler,
      async (stats) => {
        await waitFor('applied', () => stats().applied === 1, 30_000);
        expect(await effects(41)).toEqual(['attempt 2']);
      },
      hooks,
    );
  }, 60_000);

  // Review: with one connection in the pool (an application's pool), ending the session waited
  // for a connection the handler's own transaction held: the consumer was stuck for good.
  it("one on a pool of one connection, finishing late, is rolled back and tried again: the deadline's termination waits for no connection", async () => {
    const pool = new pg.Pool({ connectionString: tdb.url, max: 1 });
    const single = createDb({ pool, endPoolOnDestroy: true });
    let calls = 0;
    const handler: InboxHandler = async (trx, m) => {
      const attempt = ++calls;
      if (attempt === 1) await new Promise((r) => setTimeout(r, 2000)); // past the 800 ms deadline
      await sql`INSERT INTO effect VALUES (${seqOf(m)}, ${`attempt ${attempt}`})`.execute(trx);
    };
    try {
      await withConsumer(
        [51],
        handler,
        async (stats) => {
          await waitFor('applied', () => stats().applied === 1, 20_000);
          expect(await effects(51)).toEqual(['attempt 2']);
        },
        {},
        { db: single },
      );
    } finally {
      await single.destroy();
    }
  }, 60_000);

  // Review: once the late handler returned, the abandoned chunk went on calling handlers for
  // its next messages, which the consumer was applying alone meanwhile (their effects twice).
  it('an abandoned chunk calls no handler for its later messages', async () => {
    const called: number[] = [];
    let slow = true;
    const handler: InboxHandler = async (trx, m) => {
      const seq = seqOf(m);
      called.push(seq);
      if (seq === 61 && slow) {
        slow = false;
        await new Promise((r) => setTimeout(r, 2000)); // past the deadline, then returns
      }
      await sql`INSERT INTO effect VALUES (${seq}, 'applied')`.execute(trx).catch(() => {});
    };
    await withConsumer(
      [61, 62],
      handler,
      async (stats) => {
        await waitFor('both applied', () => stats().applied === 2, 30_000);
        await new Promise((r) => setTimeout(r, 2500)); // past the slow call's return
        expect(called.filter((s) => s === 62)).toHaveLength(1);
        expect(await effects(62)).toEqual(['applied']);
      },
      {},
      { chunkSize: 2 },
    );
  }, 60_000);

  // Review: the transaction was named by its start as text, which another session reads back
  // differently (DateStyle SQL prints a zone abbreviation: IST, read as Israel's); the session
  // was never ended and the consumer waited for good.
  it('one on sessions with DateStyle SQL and an Asia/Kolkata TimeZone is ended all the same', async () => {
    const pool = new pg.Pool({
      connectionString: tdb.url,
      max: 4,
      options: '-c DateStyle=SQL,DMY -c TimeZone=Asia/Kolkata',
    });
    const styled = createDb({ pool, endPoolOnDestroy: true });
    const handler: InboxHandler = async () => {
      await new Promise(() => {}); // never
    };
    try {
      await withConsumer(
        [71],
        handler,
        async (stats) => {
          await waitFor('dead-lettered', () => stats().deadLettered === 1, 30_000);
        },
        {},
        { db: styled },
      );
    } finally {
      await styled.destroy();
    }
  }, 60_000);

  // Review: the termination was tried once; one that could not run (no pool connection free
  // to ask with, say) left the handler waited for, for good.
  it('a termination that fails is tried again while the handler runs', async () => {
    let refusals = 0;
    const hooks: InboxTestHooks = {
      beforeTerminate() {
        if (refusals++ === 0) throw new Error('no connection to ask with (a hook)');
      },
    };
    let calls = 0;
    const handler: InboxHandler = async (trx, m) => {
      const attempt = ++calls;
      if (attempt === 1) await new Promise(() => {}); // never
      await sql`INSERT INTO effect VALUES (${seqOf(m)}, ${`attempt ${attempt}`})`.execute(trx);
    };
    await withConsumer(
      [81],
      handler,
      async (stats) => {
        await waitFor('applied', () => stats().applied === 1, 30_000);
        expect(refusals).toBeGreaterThanOrEqual(2);
        expect(await effects(81)).toEqual(['attempt 2']);
      },
      hooks,
    );
  }, 60_000);

  it('is a retriable CairnError with its own code; a bad value is refused naming the option', () => {
    const e = new HandlerTimeoutError(800);
    expect(e).toMatchObject({ code: 'handler_timeout', retriable: true });
    expect(() =>
      createInboxConsumer({
        db: tdb.db,
        groupId: 'g',
        subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId: 'g', topics: ['t'] }),
        dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        handler: async () => {},
        handlerTimeoutMs: 0,
      }),
    ).toThrow(ValidationError);
    expect(() =>
      createInboxConsumer({
        db: tdb.db,
        groupId: 'g',
        subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId: 'g', topics: ['t'] }),
        dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        handler: async () => {},
        handlerTimeoutMs: 0,
      }),
    ).toThrow(/handlerTimeoutMs/);
  });
});
