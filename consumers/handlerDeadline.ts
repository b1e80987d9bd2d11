import { setTimeout as sleep } from 'node:timers/promises';
import { sql } from 'kysely';
import type { Db } from '../src/db/database.js';
import type { Trx } from '../src/db/executor.js';
import { isConnectionLoss } from '../src/db/sqlstate.js';
import { CairnError, CairnErrorCodes, messageOf, UnavailableError } from '../src/errors.js';
import type { Logger } from '../src/logger.js';

/** The default bound on a transaction of handlers (a chunk, or one message alone). */
export const DEFAULT_HANDLER_TIMEOUT_MS = 5 * 60_000;

/** How long pg_terminate_backend waits for the handler's session to be gone. */
const TERMINATE_WAIT_MS = 5_000;
/** How often a session not ended yet is tried again while its handler runs. */
const RETRY_MS = 5_000;

/**
 * A handler's transaction ran past its bound: its session was ended, so nothing of it committed
 * and nothing it sends later lands anywhere. Retriable: the message is tried again (a hung call
 * to another service may answer next time), and dead-lettered after `maxAttempts`.
 */
export class HandlerTimeoutError extends CairnError {
  constructor(ms: number, cause?: unknown) {
    super(
      CairnErrorCodes.HandlerTimeout,
      `the handler's transaction did not finish within ${ms} ms (handlerTimeoutMs): its session was ended, nothing of it committed`,
      { retriable: true, cause },
    );
  }
}

/** Hooks at the named steps of a deadline, for the tests. */
export interface DeadlineHooks {
  /** The deadline passed; the session is about to be ended. */
  beforeTerminate?(pid: number): Promise<void> | void;
}

/**
 * Runs `work` in a transaction bounded by `ms`. Past it, the transaction's own session is ended
 * (pg_terminate_backend, from another connection of the pool) before anything else: a handler
 * still running (a call that never answers, a statement waiting on a lock) can then neither
 * commit nor, through its `trx`, write after the rollback (in autocommit, on a connection the
 * pool had given to someone else). A rollback alone could not promise that: a statement the
 * handler sends while it runs would follow it on the same connection. `signal` is aborted at
 * the deadline: a chunk calls no further handler in the abandoned transaction.
 *
 * The session is ended only while the same transaction is open in it (its pid and its
 * transaction id): a termination that waited for a connection and runs late ends nothing
 * else. When the handler settles before the session could be ended (no connection free in the
 * pool: the handler's own may be the only one), nothing more can come from it: the transaction
 * rolls back as usual. A session already gone (an idle-in-transaction timeout, Postgres
 * restarting) fails the transaction with its connection's error, which the consumer tells
 * apart (an outage is waited for). A session that is alive and not ended (no connection free
 * to ask with, a role that may not signal it) is tried again every 5 s while its handler runs,
 * and that is logged once.
 *
 * What the handler does outside the database after its deadline (JavaScript cannot be
 * stopped) still happens: effects on other services belong behind tool receipts.
 */
export function boundedTransactions(
  db: Db,
  ms: number,
  log: Logger,
  hooks: DeadlineHooks = {},
): <T>(work: (trx: Trx, signal: AbortSignal) => Promise<T>) => Promise<T> {
  /** true: ended; false: no such transaction open any more; an error: could not ask. */
  async function endSession(pid: number, xid: string): Promise<boolean> {
    await hooks.beforeTerminate?.(pid);
    const r = await sql<{ ended: boolean }>`
      SELECT pg_terminate_backend(pid, ${TERMINATE_WAIT_MS}::bigint) AS ended
        FROM pg_stat_activity
       WHERE pid = ${pid}::int AND backend_xid = ${xid}::xid`.execute(db);
    return r.rows[0]?.ended === true;
  }
  /** Undefined while the transaction's connection answers; the error once it does not. */
  const probe = (trx: Trx) =>
    sql`SELECT 1`.execute(trx).then(
      () => undefined,
      (err: unknown) => err ?? new UnavailableError("the handler's transaction's connection failed"),
    );

  return (work) => {
    /** Set past the deadline: what the transaction's failure is, whatever its rollback throws. */
    let outcome: Error | undefined;
    return db
      .transaction()
      .execute(async (trx) => {
        // The transaction's id names it, taken now (its inbox rows would take one a moment later).
        // Not its start time: a timestamp's text reads back as another time under another
        // DateStyle or TimeZone (review), and pg_stat_activity has no xact_start when
        // track_activities is off; its backend_xid is there either way.
        // Postgres ends the session itself once it has sat idle in this transaction past the
        // deadline and a margin: a consumer frozen in a handler (SIGSTOP, a suspended VM) runs
        // no timer of its own, and its uncommitted inbox rows would hold the partition's next
        // owner for good, each attempt there spent waiting on them (review).
        const { pid, xid } = (
          await sql<{ pid: number; xid: string }>`
            SELECT pg_backend_pid() AS pid, pg_current_xact_id()::xid::text AS xid,
                   set_config('idle_in_transaction_session_timeout', ${String(idleBound(ms))}, true)`.execute(
            trx,
          )
        ).rows[0]!;
        const abandon = new AbortController();
        const running = work(trx, abandon.signal);
        const settled = running.then(done, done);
        let timer: NodeJS.Timeout | undefined;
        const deadline = new Promise<'deadline'>((resolve) => {
          timer = setTimeout(() => resolve('deadline'), ms);
        });
        try {
          if ((await Promise.race([settled, deadline])) !== 'deadline') return await running;
        } finally {
          clearTimeout(timer);
        }
        // Past the deadline, even if the handler finished a moment ago: its transaction never commits.
        abandon.abort();
        outcome = new HandlerTimeoutError(ms);
        let logged = false;
        const stuck = (err?: unknown) => {
          if (logged) return;
          logged = true;
          log.error(
            { pid, handler_timeout_ms: ms, err: err === undefined ? undefined : messageOf(err) },
            "a handler's transaction is past its deadline and its session is not ended yet: trying again every 5 s while it runs",
          );
        };
        let probing: Promise<unknown> | undefined;
        // Tried again while the handler runs: the pool may have no connection to ask with now
        // (its other connections held by hung handlers too), or the role may not signal it.
        for (;;) {
          const ending = endSession(pid, xid).then(
            (ended): { ended: boolean; err?: unknown } => ({ ended }),
            (err: unknown) => ({ ended: false, err }),
          );
          let first = await Promise.race([ending, settled, pause(RETRY_MS)]);
          if (first === 'pause') {
            stuck(); // waiting for a pool connection to ask with
            first = await Promise.race([ending, settled]);
          }
          if (first === 'done') {
            // It can send nothing more: a rollback will do. A termination already under way is
            // let finish first (it must not reach the session once the pool gave it to another).
            await Promise.race([ending, pause(TERMINATE_WAIT_MS)]);
            throw outcome;
          }
          // Ended (its process gone): nothing to ask its connection. Not after a check either: one
          // queued behind a statement may answer from before the end (review).
          if (first.ended) throw outcome;
          // One check of the connection at a time, waited for no longer than a retry's pause:
          // it queues behind the handler's statement, which may be waiting on a lock.
          probing ??= probe(trx);
          const answer = await Promise.race([probing, settled, pause(RETRY_MS)]);
          if (answer === 'done') throw outcome;
          if (answer === 'pause') {
            stuck(first.err);
            continue;
          }
          probing = undefined;
          const lost = answer;
          if (lost !== undefined && isConnectionLoss(lost)) {
            // Gone by itself (an idle-in-transaction timeout, Postgres restarting): its own error,
            // which the consumer tells apart (an outage is waited for).
            outcome = lost as Error;
            throw outcome;
          }
          stuck(first.err);
          if ((await Promise.race([settled, pause(RETRY_MS)])) === 'done') throw outcome;
        }
      })
      .catch((err: unknown) => {
        // The rollback on an ended session fails too, and kysely throws its error instead.
        throw outcome ?? err;
      });
  };
}

/**
 * How long a handler's session may sit idle in its transaction before Postgres ends it: past
 * the deadline by a termination's wait, so the consumer's own termination (which names the
 * deadline) comes first whenever the consumer runs.
 */
export const idleBound = (ms: number) => Math.min(ms + TERMINATE_WAIT_MS, 2_147_483_647);

const done = () => 'done' as const;

/** Resolves 'pause' after `ms`, holding no process open. */
const pause = (ms: number) => sleep(ms, 'pause' as const, { ref: false });
