import { sql } from 'kysely';
import type { Db } from '../src/db/database.js';
import type { Trx } from '../src/db/executor.js';
import { SqlState, sqlState } from '../src/db/sqlstate.js';
import { CairnError, CairnErrorCodes } from '../src/errors.js';
import type { InboxMessage } from './inboxMessage.js';

/** `handlerTimeoutMs` when not set. */
export const DEFAULT_HANDLER_TIMEOUT_MS = 60_000;
/** How long a chunk's statement waits for a row lock before the chunk is tried again. */
const CHUNK_LOCK_TIMEOUT_MS = 5_000;
/** Idle time in a chunk's transaction beyond a handler's deadline before Postgres ends the session. */
const IDLE_SLACK_MS = 5_000;

/** A handler abandoned at its deadline; `offset` says which message of the chunk it was. */
export class HandlerTimeoutError extends CairnError {
  constructor(
    readonly offset: string,
    messageId: string,
    ms: number,
  ) {
    super(
      CairnErrorCodes.HandlerTimeout,
      `the handler did not finish message ${messageId} within handlerTimeoutMs (${ms} ms): abandoned and ` +
        'its transaction rolled back. Make the handler stop on its AbortSignal, or raise handlerTimeoutMs',
      { retriable: true },
    );
  }
}

/**
 * Bounds every wait of a chunk's transaction, on the server, so that a consumer that hangs
 * or is paused (SIGSTOP, a VM frozen) cannot hold the chunk's inbox rows, and the rows its
 * handlers wrote, for good: the partition's next owner inserts the same message ids and waits
 * on them. lock_timeout: a consumer blocked on rows another one holds gets 55P03 within
 * seconds and tries again (heldElsewhere), instead of waiting on the unique index with no
 * heartbeat while its own partitions move. statement_timeout and
 * idle_in_transaction_session_timeout: a paused consumer runs no timer of its own, so
 * Postgres ends its transaction (at most a handler's deadline, and some slack, after its last
 * statement) and the inbox rows it held go; when it wakes up its connection is gone, and what
 * it applied meanwhile is the new owner's duplicate. One round trip per chunk; it also returns
 * the backend's pid, for cancelling a statement of a handler abandoned at its deadline.
 */
export async function boundChunkTransaction(trx: Trx, handlerTimeoutMs: number): Promise<number> {
  // Under the statement timeout: a lock wait must end as a lock wait (not the message's), never as a statement too slow (the message's).
  const lockMs = Math.max(1, Math.min(CHUNK_LOCK_TIMEOUT_MS, Math.floor(handlerTimeoutMs / 2)));
  const { rows } = await sql<{ pid: number }>`
    SELECT pg_backend_pid() AS pid,
           set_config('lock_timeout', ${String(lockMs)}, true),
           set_config('statement_timeout', ${String(handlerTimeoutMs)}, true),
           set_config('idle_in_transaction_session_timeout', ${String(Math.min(2 ** 31 - 1, handlerTimeoutMs + IDLE_SLACK_MS))}, true)`.execute(
    trx,
  );
  return rows[0]!.pid;
}

/** 55P03: a row lock another transaction holds (a previous owner of the partition still in its chunk). Never the message's fault. */
export function heldElsewhere(err: unknown): boolean {
  return sqlState(err) === SqlState.lockNotAvailable;
}

/**
 * Runs one message's handler with a deadline. At it, the handler's signal is aborted, its
 * statement in flight (if any) is cancelled, and a HandlerTimeoutError is thrown: the chunk's
 * transaction rolls back, after which kysely refuses the abandoned handler's `trx`, so one
 * that ignores the signal writes nothing. The cancel is sent before the throw, while the
 * connection is still this transaction's (a cancel arriving after the connection went back to
 * the pool could hit another one's statement); an idle backend ignores it.
 */
export async function runWithDeadline(
  run: (signal: AbortSignal) => Promise<void>,
  o: { db: Db; pid: number; ms: number; message: InboxMessage },
): Promise<void> {
  const abort = new AbortController();
  let expired: HandlerTimeoutError | undefined;
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<void>((resolve) => {
    timer = setTimeout(() => {
      expired = new HandlerTimeoutError(o.message.offset, o.message.messageId, o.ms);
      abort.abort(expired);
      resolve();
    }, o.ms);
  });
  const work = run(abort.signal);
  work.catch(() => {}); // settled after its deadline: already abandoned
  try {
    // Once the deadline passed, whatever the handler does next (return, throw on the abort)
    // changes nothing: it was abandoned.
    await Promise.race([work, late]).catch((err: unknown) => {
      if (!expired) throw err;
    });
  } finally {
    clearTimeout(timer);
  }
  if (expired) {
    await cancelStatement(o.db, o.pid);
    throw expired;
  }
}

/** pg_cancel_backend with its own deadline: a pool with no free connection must not hold the abandoning up (statement_timeout is the backstop). */
async function cancelStatement(db: Db, pid: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    sql`SELECT pg_cancel_backend(${pid})`.execute(db).catch(() => {}),
    new Promise((r) => {
      timer = setTimeout(r, 2_000);
    }),
  ]);
  clearTimeout(timer);
}
