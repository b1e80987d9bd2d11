import { setTimeout as sleep } from 'node:timers/promises';
import { CairnError, ConfigurationError } from '../errors.js';
import type { Logger } from '../logger.js';

export type Dependency = 'postgres' | 'kafka';

export interface UntilReachableOptions {
  dependency: Dependency;
  /** Named in every log line and error; never holds a password (see redact). */
  address: string;
  logger: Logger;
  /** Errors that waiting cannot fix: thrown at once as a ConfigurationError. */
  isConfigurationError(err: unknown): boolean;
  /** Errors that are no outage of the dependency (a statement it refused): thrown as they are. */
  isFinal?(err: unknown): boolean;
  /** Aborted by stop()/SIGTERM: the wait ends within moments with 'stopped'. */
  signal?: AbortSignal;
  /** true after the first failed attempt, false once an attempt succeeded (or the wait stopped). */
  onWaiting?(waiting: boolean): void;
  /** First pause between attempts; it doubles up to maxDelayMs. Defaults 250 ms and 5 s. */
  minDelayMs?: number;
  maxDelayMs?: number;
}

/**
 * Runs `attempt` until it succeeds, pausing between tries with capped exponential backoff.
 * A process started while Postgres or the broker is down waits for it and says so (with the
 * address) instead of exiting: an orchestrator that starts everything at once, or restarts
 * the database, must not have to restart Cairn's processes too. Only a configuration error
 * ends the wait early, thrown as ConfigurationError with the address and what was refused,
 * or a CairnError that is not retriable (such as TopicMissingError), thrown as it is.
 */
export async function untilReachable(
  attempt: () => Promise<void>,
  o: UntilReachableOptions,
): Promise<'reached' | 'stopped'> {
  const minDelayMs = o.minDelayMs ?? 250;
  const maxDelayMs = o.maxDelayMs ?? 5000;
  const fields = { dependency: o.dependency, address: o.address };
  for (let n = 1; ; n++) {
    if (o.signal?.aborted) return stopped(o);
    try {
      await attempt();
      if (n > 1) {
        o.logger.info({ ...fields, attempts: n }, `${o.dependency} at ${o.address} answers; starting`);
        o.onWaiting?.(false);
      }
      return 'reached';
    } catch (err) {
      const message = (err as Error)?.message ?? String(err);
      // Cairn's own errors that say waiting will not help (a topic that does not exist) already
      // name what is wrong and the fix: thrown as they are, code included.
      if ((err instanceof CairnError && !err.retriable) || o.isFinal?.(err)) {
        o.onWaiting?.(false);
        throw err;
      }
      if (o.isConfigurationError(err)) {
        o.onWaiting?.(false);
        throw new ConfigurationError(
          `${o.dependency} at ${o.address} refused the configuration: ${message}. ` +
            `Fix ${o.dependency === 'postgres' ? 'DATABASE_URL (user, password, database name)' : 'KAFKA_BROKERS'}; waiting will not help.`,
          err,
        );
      }
      if (o.signal?.aborted) return stopped(o);
      if (n === 1) o.onWaiting?.(true);
      // Jitter (up to a fifth of the pause) keeps a fleet that lost the same server from retrying in step.
      const base = Math.min(maxDelayMs, minDelayMs * 2 ** Math.min(n - 1, 16));
      const delay = Math.round(base * (0.8 + Math.random() * 0.2));
      o.logger.warn(
        { ...fields, attempt: n, retry_in_ms: delay, err: message },
        `waiting for ${o.dependency} at ${o.address}`,
      );
      try {
        await sleep(delay, undefined, o.signal ? { signal: o.signal } : {});
      } catch {
        return stopped(o);
      }
    }
  }
}

function stopped(o: UntilReachableOptions): 'stopped' {
  o.onWaiting?.(false);
  return 'stopped';
}
