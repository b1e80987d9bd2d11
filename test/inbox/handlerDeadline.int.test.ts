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
import { describe, expect, it } from 'vitest';
import { HandlerTimeoutError } from '../../consumers/handlerDeadline.js';
import { createInboxConsumer, type InboxHandler } from '../../consumers/inboxConsumer.js';
import type { InboxTestHooks } from '../../consumers/inboxTypes.js';
import { ValidationError } from '../../src/errors.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { kafkaBrokers } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { deadlineHarness, seqOf } from './handlerDeadlineHarness.js';

const h = deadlineHarness('inbox_handler_deadline');

describe('an inbox handler past handlerTimeoutMs', () => {
  it('one that never returns is tried again, then dead-lettered with the deadline named; the partition moves on', async () => {
    const handler: InboxHandler = async (trx, m) => {
      const seq = seqOf(m);
      if (seq === 1) await new Promise(() => {}); // never
      await sql`INSERT INTO effect VALUES (${seq}, 'applied')`.execute(trx);
    };
    await h.withConsumer([1, 2], handler, async (stats, groupId) => {
      await waitFor(
        'one applied, one dead-lettered',
        () => stats().applied === 1 && stats().deadLettered === 1,
        30_000,
      );
      expect(stats().retries).toBe(1);
      expect(await h.effects(1)).toEqual([]);
      expect(await h.effects(2)).toEqual(['applied']);
      const [letter] = await h.tdb.db
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
    await h.withConsumer([11], handler, async (stats) => {
      await waitFor('applied', () => stats().applied === 1, 30_000);
      await waitFor('the first attempt woke and wrote', () => late.length === 1, 10_000);
      expect(late[0]).not.toBe('written');
      expect(await h.effects(11)).toEqual(['attempt 2: after', 'attempt 2: before']);
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
    await h.withConsumer([15], handler, async (stats) => {
      await waitFor('applied', () => stats().applied === 1, 30_000);
      await waitFor('the first attempt ended', () => late.length === 1, 10_000);
      await new Promise((r) => setTimeout(r, 1500)); // past the first attempt's pg_sleep
      expect(late[0]).not.toBe('written');
      expect(await h.effects(15)).toEqual(['attempt 2']);
    });
  }, 60_000);

  it('one waiting on a lock is ended (its statement with it) and applied once the lock is free', async () => {
    // Another session holds the row the handler updates.
    const holder = new pg.Client({ connectionString: h.tdb.url });
    holder.on('error', () => {}); // ended with the database, should the test fail first
    await holder.connect();
    const { rows: at } = await sql<{ schema: string }>`SELECT current_schema() AS schema`.execute(h.tdb.db);
    await holder.query('BEGIN');
    await holder.query(`SELECT n FROM ${at[0]!.schema}.locked WHERE id = 1 FOR UPDATE`);
    let calls = 0;
    const handler: InboxHandler = async (trx) => {
      calls++;
      await sql`UPDATE locked SET n = n + 1 WHERE id = 1`.execute(trx);
    };
    await h.withConsumer([21], handler, async (stats) => {
      await waitFor('the first attempt ended', () => stats().retries === 1, 20_000);
      await holder.query('COMMIT');
      await holder.end();
      await waitFor('applied', () => stats().applied === 1, 20_000);
      const { rows } = await sql<{ n: number }>`SELECT n FROM locked WHERE id = 1`.execute(h.tdb.db);
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
    await h.withConsumer(
      [31],
      handler,
      async (stats) => {
        await waitFor('applied', () => stats().applied === 1, 30_000);
        // Its chunk failed at the deadline, and the message alone went at once (no retry counted).
        expect(calls).toBe(2);
        expect(await h.effects(31)).toEqual(['attempt 2']);
      },
      hooks,
    );
  }, 60_000);

  it('is a retriable CairnError with its own code; a bad value is refused naming the option', () => {
    const e = new HandlerTimeoutError(800);
    expect(e).toMatchObject({ code: 'handler_timeout', retriable: true });
    const zero = () =>
      createInboxConsumer({
        db: h.tdb.db,
        groupId: 'g',
        subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId: 'g', topics: ['t'] }),
        dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        handler: async () => {},
        handlerTimeoutMs: 0,
      });
    expect(zero).toThrow(ValidationError);
    expect(zero).toThrow(/handlerTimeoutMs/);
  });
});
