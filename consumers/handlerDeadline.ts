import { sql } from 'kysely';
import type { Trx } from '../src/db/executor.js';
import { CairnError, CairnErrorCodes } from '../src/errors.js';
import type { BatchHeartbeat } from './heartbeat.js';

/** Default `handlerTimeoutMs`: Kafka's own bound on a consumer between two polls (max.poll.interval.ms). */
export const DEFAULT_HANDLER_TIMEOUT_MS = 300_000;

/** How often a running handler's batch heartbeat is offered (it sends one when about a second passed). */
const BEAT_EVERY_MS = 500;

/**
 * A handler did not finish within `handlerTimeoutMs`: its transaction was rolled back and the
 * message is tried again (then dead-lettered, as any failure). The handler's call may still be
 * running: anything it does with its transaction from then on is refused with this error.
 */
export class HandlerTimeoutError extends CairnError {
  constructor(messageId: string, ms: number) {
    super(
      CairnErrorCodes.HandlerTimeout,
      `the handler did not finish message ${messageId} within ${ms} ms (handlerTimeoutMs): its transaction is rolled back`,
      { retriable: true },
    );
  }
}

/** A chunk's transaction as its handlers get it, and each handler's call bounded in time. */
export interface HandlerDeadline {
  /** The transaction, refusing every query once a handler's time ran out. */
  trx: Trx;
  /** The call, rejected with a HandlerTimeoutError once `ms` passed; the heartbeat offered meanwhile. */
  run(messageId: string, call: () => Promise<void>): Promise<void>;
  /** The error the chunk failed with, when a handler ran out of time. */
  readonly expired: HandlerTimeoutError | undefined;
}

/**
 * Bounds each handler call of a chunk's transaction (one per chunk). A handler that never
 * returns held its chunk's transaction, the inbox rows it locked and the partition for good:
 * the next owner of the partition blocks on those rows too. Past `ms`:
 *  - the guarded transaction refuses every query at once, before it reaches the connection
 *    (the rollback goes out next; a query sent after it would run outside the transaction);
 *  - the chunk fails with a HandlerTimeoutError, its transaction is rolled back;
 *  - a handler's query still running on the connection would hold the rollback behind it:
 *    `statement_timeout` bounds each statement of the transaction by `ms` (lowered, never
 *    raised above the connection's own).
 * The heartbeat is offered while a handler runs, so a slow one keeps the partition until `ms`.
 */
export function handlerDeadline(
  trx: Trx,
  ms: number,
  heartbeat: BatchHeartbeat | undefined,
): HandlerDeadline {
  let limited = false;
  let expired: HandlerTimeoutError | undefined;
  const guarded = trx.withPlugin({
    transformQuery(args) {
      if (expired) throw expired;
      return args.node;
    },
    transformResult: async (args) => args.result,
  });
  return {
    trx: guarded,
    async run(messageId, call) {
      if (!limited) {
        // Once per chunk, before its first handler (a chunk of duplicates runs none).
        await sql`
          SELECT set_config('statement_timeout', ${String(ms)}, true) FROM pg_settings
           WHERE name = 'statement_timeout' AND (setting::bigint = 0 OR setting::bigint > ${ms})`.execute(
          trx,
        );
        limited = true;
      }
      let timer: NodeJS.Timeout | undefined;
      const beating = heartbeat && setInterval(() => heartbeat.beat(), BEAT_EVERY_MS);
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          expired = new HandlerTimeoutError(messageId, ms);
          reject(expired);
        }, ms);
      });
      try {
        await Promise.race([call(), timeout]);
      } finally {
        clearTimeout(timer);
        clearInterval(beating);
      }
    },
    get expired() {
      return expired;
    },
  };
}
