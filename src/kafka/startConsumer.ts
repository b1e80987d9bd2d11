import type { Logger } from '../logger.js';
import { untilReachable } from '../startup/untilReachable.js';
import { isKafkaConfigurationError } from './classifyError.js';

/**
 * A subscriber's start, whatever its client: check the topics (`probe`), then `start` the
 * consumer, again and again with capped backoff until the broker answers (`waiting` says so
 * meanwhile), `close` after a failed attempt. Resolves 'stopped' when `signal` ends the wait;
 * a configuration error (credentials refused) rejects at once.
 */
export function startWhenReachable(o: {
  brokers: readonly string[];
  log: Logger;
  signal: AbortSignal;
  probe(): Promise<void>;
  start(): Promise<void>;
  close(): Promise<void>;
  waiting(w: boolean): void;
}): Promise<'reached' | 'stopped'> {
  return untilReachable(
    async () => {
      await o.probe();
      try {
        await o.start();
      } catch (err) {
        await o.close();
        throw err;
      }
    },
    {
      dependency: 'kafka',
      address: o.brokers.join(','),
      logger: o.log,
      isConfigurationError: isKafkaConfigurationError,
      signal: o.signal,
      onWaiting: (w) => o.waiting(w),
    },
  );
}
