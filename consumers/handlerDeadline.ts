import { sql } from 'kysely';
import type { Db } from '../src/db/database.js';
import type { Trx } from '../src/db/executor.js';
import { CairnError, CairnErrorCodes, messageOf } from '../src/errors.js';
import type { Logger } from '../src/logger.js';

/** The default bound on a transaction of handlers (a chunk, or one message alone). */
export const DEFAULT_HANDLER_TIMEOUT_MS = 5 * 60_000;

/** How long pg_terminate_backend waits for the handler's session to be gone. */
const TERMINATE_WAIT_MS = 5_000;

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
 * pool had given to someone else). A rollback alone could not promise that: a query the
 * handler sends while it runs would follow it on the same connection.
 *
 * When the session cannot be ended (no connection free in the pool to ask with, no right to
 * signal it), the handler is waited for as without a bound, and that is logged: a connection
 * handed back while its handler may still use it would be worse than a partition held.
 *
 * What the handler does outside the database after its deadline (JavaScript cannot be
 * stopped) still happens: effects on other services belong behind tool receipts.
 */
export function boundedTransactions(
  db: Db,
  ms: number,
  log: Logger,
  hooks: DeadlineHooks = {},
): <T>(work: (trx: Trx) => Promise<T>) => Promise<T> {
  async function endSession(pid: number, trx: Trx): Promise<boolean> {
    try {
      await hooks.beforeTerminate?.(pid);
      const r = await sql<{ ended: boolean }>`
        SELECT pg_terminate_backend(${pid}::int, ${TERMINATE_WAIT_MS}::bigint) AS ended`.execute(db);
      if (r.rows[0]?.ended !== true) return false;
    } catch (err) {
      log.error({ err: messageOf(err), pid }, "could not end a handler's session past its deadline");
      return false;
    }
    // The transaction's connection has seen the end: a statement on it fails (it queues behind
    // any the handler has in flight, which fail with it).
    return sql`SELECT 1`.execute(trx).then(
      () => false,
      () => true,
    );
  }

  return (work) => {
    let expired = false;
    return db
      .transaction()
      .execute(async (trx) => {
        const pid = (await sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`.execute(trx)).rows[0]!.pid;
        const running = work(trx);
        running.catch(() => {}); // settled later or never: its outcome is read below, or not at all
        let timer: NodeJS.Timeout | undefined;
        const deadline = new Promise<'deadline'>((resolve) => {
          timer = setTimeout(() => resolve('deadline'), ms);
        });
        try {
          const first = await Promise.race([running.then(done, done), deadline]);
          if (first !== 'deadline') return await running;
        } finally {
          clearTimeout(timer);
        }
        // Past the deadline, even if the handler finished a moment ago: its transaction never
        // commits, and its session is ended before the connection is given back.
        if (await endSession(pid, trx)) {
          expired = true;
          throw new HandlerTimeoutError(ms);
        }
        log.error(
          { pid, handler_timeout_ms: ms },
          "a handler's transaction is past its deadline and its session could not be ended: waiting for it",
        );
        return await running;
      })
      .catch((err: unknown) => {
        // The rollback on an ended session fails too, and kysely throws its error instead.
        throw expired && !(err instanceof HandlerTimeoutError) ? new HandlerTimeoutError(ms, err) : err;
      });
  };
}

const done = () => 'done' as const;
