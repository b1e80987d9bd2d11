import pRetry from 'p-retry';
import { isRetriableSqlError, SqlState, sqlState } from '../db/sqlstate.js';
import { messageOf, UnavailableError } from '../errors.js';
import type { Logger } from '../logger.js';

/** Postgres, or the key provider sealing a result, not answering now. */
const mayRetry = (err: unknown) =>
  isRetriableSqlError(err) ||
  sqlState(err) === SqlState.queryCanceled ||
  (err instanceof UnavailableError && !err.refused);

/**
 * Records how an effect ended. Only its worker knows it: Postgres (or the key provider that
 * seals a result) going away for a moment must
 * not lose it (a receipt left started is later taken for uncertain, and a known success gated,
 * compensated or run again). The update is the same each time it is sent, so it is sent again,
 * with capped backoff, until Postgres takes it.
 */
export function recordThroughOutages<R>(log: Logger, what: string, write: () => Promise<R>): Promise<R> {
  return pRetry(write, {
    retries: Number.POSITIVE_INFINITY,
    minTimeout: 100,
    maxTimeout: 5000,
    shouldRetry: ({ error }) => mayRetry(error),
    onFailedAttempt: ({ error, attemptNumber }) => {
      if (mayRetry(error))
        log.warn({ err: messageOf(error), attempt: attemptNumber }, `recording ${what}: trying again`);
    },
  });
}
