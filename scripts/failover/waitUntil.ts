import { setTimeout as sleep } from 'node:timers/promises';
import { isDatabaseOutage, sqlState } from '../../src/db/sqlstate.js';

/** How the failover scenario waits for a condition, up to a deadline. */
export type WaitUntil = (what: string, check: () => Promise<boolean>, deadlineMs: number) => Promise<void>;

/**
 * A check's failure that asking again may cure: Postgres not serving (isDatabaseOutage) or short
 * of resources (53xxx: memory, disk, connections), or a connection slow to open or refused a
 * local port on a machine busy with other tests (pg's Client says "timeout expired"; its Pool,
 * "Connection terminated due to connection timeout").
 */
export const isTransientCheckError = (err: unknown): boolean =>
  isDatabaseOutage(err) ||
  (sqlState(err)?.startsWith('53') ?? false) ||
  (err as { code?: unknown } | null)?.code === 'EADDRNOTAVAIL' ||
  /timeout expired/i.test((err as Error | null)?.message ?? '');

/**
 * Asks `check` until it holds. A check that fails for an outage (isTransientCheckError) is
 * asked again; any other error (a mistake in its SQL) ends the wait at once, named. A check
 * still running at the deadline (a query on a server that does not answer) is not waited for.
 * At the deadline the last check's error, if it failed, is named.
 */
export const waitUntil: WaitUntil = async (what, check, deadlineMs) => {
  const until = Date.now() + deadlineMs;
  let lastError: unknown;
  for (;;) {
    const stopped = new AbortController();
    try {
      const answer = await Promise.race([
        check(),
        sleep(Math.max(0, until - Date.now()), 'still running' as const, { signal: stopped.signal }),
      ]);
      if (answer === true) return;
      lastError = answer === 'still running' ? new Error('a check was still running') : undefined;
    } catch (err) {
      if (!isTransientCheckError(err))
        throw new Error(
          `failover: waiting for ${what}, a check failed: ${(err as Error)?.message ?? String(err)}`,
          {
            cause: err,
          },
        );
      lastError = err;
    } finally {
      stopped.abort();
    }
    if (Date.now() >= until) {
      const why =
        lastError === undefined
          ? ''
          : ` (the last check failed: ${lastError instanceof Error ? lastError.message : String(lastError)})`;
      throw new Error(`failover: timed out after ${deadlineMs} ms waiting for ${what}${why}`);
    }
    await sleep(50);
  }
};
