/**
 * The handler deadline (consumers/handlerDeadline.ts) against what its reviews found: a session
 * gone before its deadline, a pool of one connection, an abandoned chunk, sessions of another
 * DateStyle and TimeZone, a termination that fails (test/inbox/handlerDeadline.int has the
 * deadline's own cases).
 */
import { sql } from 'kysely';
import pg from 'pg';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { boundedTransactions, idleBound } from '../../consumers/handlerDeadline.js';
import type { InboxHandler } from '../../consumers/inboxConsumer.js';
import type { InboxTestHooks } from '../../consumers/inboxTypes.js';
import { createDb } from '../../src/db/database.js';
import { waitFor } from '../support/topicReader.js';
import { deadlineHarness, hangsOnce, seqOf } from './handlerDeadlineHarness.js';

const h = deadlineHarness('inbox_handler_deadline_review');

describe('an inbox handler past handlerTimeoutMs, after review', () => {
  // Review: a consumer frozen inside a handler (SIGSTOP, a suspended VM) runs no timer: its
  // deadline never ends its session, and its uncommitted inbox rows held the partition's next
  // owner, whose every attempt waited on them until it dead-lettered a healthy message.
  it('a consumer frozen in its handler holds no row for good: Postgres ends its session past the deadline', async () => {
    // The consumer's own termination never comes (as in a frozen process): only Postgres can end it.
    let thaw!: () => void;
    const thawed = new Promise<void>((r) => {
      thaw = r;
    });
    const frozen = boundedTransactions(h.tdb.db, 800, pino({ level: 'silent' }), {
      beforeTerminate: () => thawed,
    });
    let entered!: () => void;
    const inHandler = new Promise<void>((r) => {
      entered = r;
    });
    const ended = frozen(async (trx) => {
      await sql`UPDATE locked SET n = n + 1 WHERE id = 1`.execute(trx);
      entered();
      await new Promise(() => {}); // no statement, no commit: idle in its transaction
    }).catch((err: unknown) => err);
    await inHandler;
    // The partition's next owner, waiting on what the frozen one holds (its inbox rows; a row here).
    await h.tdb.db.transaction().execute(async (trx) => {
      await sql.raw(`SET LOCAL lock_timeout = '${idleBound(800) + 15_000}ms'`).execute(trx);
      await sql`UPDATE locked SET n = n + 10 WHERE id = 1`.execute(trx); // before: lock_timeout, the row still held
    });
    const { rows } = await sql<{ n: number }>`SELECT n FROM locked WHERE id = 1`.execute(h.tdb.db);
    expect(rows[0]?.n).toBe(10); // the frozen transaction's +1 rolled back
    await sql`UPDATE locked SET n = 0 WHERE id = 1`.execute(h.tdb.db);
    // Thawed, the consumer finds its session gone (a connection error: what it tells an outage by) and lets its connection go.
    thaw();
    expect(String(await ended)).toMatch(/terminat|connection/i);
  }, 60_000);

  // Review: a session already gone at the deadline (an idle-in-transaction timeout, a DBA's
  // kill) made the termination find nothing, and the consumer waited for the handler for good.
  it('one whose session ended by itself before its deadline ran out is tried again (its connection error, not a wait)', async () => {
    const { handler, calls } = hangsOnce();
    const hooks: InboxTestHooks = {
      async beforeTerminate(pid) {
        if (calls() === 1) await sql`SELECT pg_terminate_backend(${pid}::int, 5000)`.execute(h.tdb.db);
      },
    };
    await h.withConsumer(
      [41],
      handler,
      async (stats) => {
        await waitFor('applied', () => stats().applied === 1, 30_000);
        expect(await h.effects(41)).toEqual(['attempt 2']);
      },
      hooks,
    );
  }, 60_000);

  // Review: with one connection in the pool (an application's pool), ending the session waited
  // for a connection the handler's own transaction held: the consumer was stuck for good.
  it("one on a pool of one connection, finishing late, is rolled back and tried again: the deadline's termination waits for no connection", async () => {
    const pool = new pg.Pool({ connectionString: h.tdb.url, max: 1 });
    const single = createDb({ pool, endPoolOnDestroy: true });
    let calls = 0;
    const handler: InboxHandler = async (trx, m) => {
      const attempt = ++calls;
      if (attempt === 1) await new Promise((r) => setTimeout(r, 2000)); // past the 800 ms deadline
      await sql`INSERT INTO effect VALUES (${seqOf(m)}, ${`attempt ${attempt}`})`.execute(trx);
    };
    try {
      await h.withConsumer(
        [51],
        handler,
        async (stats) => {
          await waitFor('applied', () => stats().applied === 1, 20_000);
          expect(await h.effects(51)).toEqual(['attempt 2']);
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
    await h.withConsumer(
      [61, 62],
      handler,
      async (stats) => {
        await waitFor('both applied', () => stats().applied === 2, 30_000);
        await new Promise((r) => setTimeout(r, 2500)); // past the slow call's return
        expect(called.filter((s) => s === 62)).toHaveLength(1);
        expect(await h.effects(62)).toEqual(['applied']);
      },
      {},
      { chunkSize: 2 },
    );
  }, 60_000);

  // Review: the transaction was named by its start as text, which another session reads back
  // differently (DateStyle SQL prints a zone abbreviation: IST, read as Israel's); the session
  // was never ended and the consumer waited for good.
  // Review: with track_activities off (a setting some sites turn off for its cost),
  // pg_stat_activity has no xact_start, by which the transaction was named: never ended.
  it.for([
    ['DateStyle SQL and an Asia/Kolkata TimeZone', '-c DateStyle=SQL,DMY -c TimeZone=Asia/Kolkata'],
    ['track_activities off', '-c track_activities=off'],
  ] as const)(
    'one on sessions with %s is ended all the same',
    { timeout: 60_000 },
    async ([, options], { skip }) => {
      const { rows } = await sql<{ su: boolean }>`
        SELECT rolsuper AS su FROM pg_roles WHERE rolname = current_user`.execute(h.tdb.db);
      // Only a superuser may turn track_activities off for its session.
      if (options.includes('track_activities') && !rows[0]?.su) skip('needs a superuser DATABASE_URL');
      const pool = new pg.Pool({ connectionString: h.tdb.url, max: 4, options });
      const styled = createDb({ pool, endPoolOnDestroy: true });
      const handler: InboxHandler = async () => {
        await new Promise(() => {}); // never
      };
      try {
        await h.withConsumer(
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
    },
  );

  // Review: the termination was tried once; one that could not run (no pool connection free
  // to ask with, say) left the handler waited for, for good.
  it('a termination that fails is tried again while the handler runs', async () => {
    let refusals = 0;
    const hooks: InboxTestHooks = {
      beforeTerminate() {
        if (refusals++ === 0) throw new Error('no connection to ask with (a hook)');
      },
    };
    const { handler } = hangsOnce();
    await h.withConsumer(
      [81],
      handler,
      async (stats) => {
        await waitFor('applied', () => stats().applied === 1, 30_000);
        expect(refusals).toBeGreaterThanOrEqual(2);
        expect(await h.effects(81)).toEqual(['attempt 2']);
      },
      hooks,
    );
  }, 60_000);

  // Review: a termination that failed while the handler waited on a lock left the check of its
  // connection (a `SELECT 1` on the same connection) queued behind that statement: no retry came.
  it('a termination that fails while the handler waits on a lock is tried again', async () => {
    const holder = await advisoryLockHolder(4242);
    let refusals = 0;
    const hooks: InboxTestHooks = {
      async beforeTerminate(pid) {
        if (refusals++ > 0) return;
        await waitingOnLock(pid); // the check of its connection will queue behind that statement
        throw new Error('no connection to ask with (a hook)');
      },
    };
    let calls = 0;
    const handler: InboxHandler = async (trx, m) => {
      const attempt = ++calls;
      if (attempt === 1) await sql`SELECT pg_advisory_xact_lock(4242)`.execute(trx); // waits
      await sql`INSERT INTO effect VALUES (${seqOf(m)}, ${`attempt ${attempt}`})`.execute(trx);
    };
    await h.withConsumer(
      [91],
      handler,
      async (stats) => {
        try {
          await waitFor('applied', () => stats().applied === 1, 30_000);
        } finally {
          await holder.end(); // before the consumer stops: a stuck deadline would hold its stop
        }
        expect(refusals).toBeGreaterThanOrEqual(2);
        expect(await h.effects(91)).toEqual(['attempt 2']);
      },
      hooks,
    );
  }, 60_000);

  // Review: a check of the connection queued behind the handler's statement answered (alive)
  // once the lock was granted; the next termination succeeded, and that old answer made the
  // loop wait, then take the ended session's error for an outage: no HandlerTimeoutError.
  it('one ended after a failed termination while it waited on a lock fails with the deadline, not an outage', async () => {
    const holder = await advisoryLockHolder(4343);
    let terminations = 0;
    const hooks: InboxTestHooks = {
      async beforeTerminate(pid) {
        if (terminations++ === 0) {
          await waitingOnLock(pid);
          throw new Error('no connection to ask with (a hook)');
        }
        // The lock granted, the queued check answered, the handler now hangs in JavaScript.
        await holder.query('SELECT pg_advisory_unlock(4343)');
        await waitFor(
          'the check answered',
          async () => (await stateOf(pid)) === 'idle in transaction',
          10_000,
        );
      },
    };
    let calls = 0;
    const handler: InboxHandler = async (trx) => {
      if (++calls > 1) return;
      await sql`SELECT pg_advisory_xact_lock(4343)`.execute(trx); // waits
      await new Promise(() => {}); // then never returns
    };
    const lines: string[] = [];
    try {
      await h.withConsumer(
        [95],
        handler,
        async (stats) => {
          await waitFor('applied', () => stats().applied === 1, 40_000);
          // The chunk failed with its deadline (its message then applied alone), not with the
          // ended session's connection error taken for an outage (the chunk read again).
          const failed = lines.map((l) => JSON.parse(l)).filter((l) => /chunk failed/.test(l.msg));
          expect(failed.map((l) => l.err)).toEqual([expect.stringMatching(/handlerTimeoutMs/)]);
        },
        hooks,
        { logger: pino({ level: 'warn' }, { write: (l: string) => void lines.push(l) }) },
      );
    } finally {
      await holder.end();
    }
  }, 60_000);
});

/** Until the session `pid` waits on a lock it asked for. */
async function waitingOnLock(pid: number): Promise<void> {
  await waitFor(
    'the handler waiting on its lock',
    async () =>
      (
        await sql<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_locks WHERE pid = ${pid}::int AND NOT granted`.execute(h.tdb.db)
      ).rows[0]!.n > 0,
    10_000,
  );
}

async function stateOf(pid: number): Promise<string | undefined> {
  const { rows } = await sql<{ state: string }>`
    SELECT state FROM pg_stat_activity WHERE pid = ${pid}::int`.execute(h.tdb.db);
  return rows[0]?.state;
}

/** Another session, holding the advisory lock `key` until it ends. */
async function advisoryLockHolder(key: number): Promise<pg.Client> {
  const holder = new pg.Client({ connectionString: h.tdb.url });
  holder.on('error', () => {}); // ended with the database, should the test fail first
  await holder.connect();
  await holder.query('SELECT pg_advisory_lock($1)', [key]);
  return holder;
}
