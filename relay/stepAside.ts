import { isBrokerUnreachable } from '../src/kafka/classifyError.js';

/**
 * When a relay that cannot reach the broker gives its lanes to the others. A relay that alone
 * cannot reach it (its network, a producer stuck) kept its lanes, renewing them in Postgres,
 * and their messages waited for good while other relays could send them. After twice the lease
 * TTL of sends failing because the broker could not be reached (isBrokerUnreachable: not a
 * broker's answer about a message or a topic, which would follow the lane to any relay), the
 * relay steps aside if another relay is live (relay/sql/laneLeases.ts stepAsideIfOthersLive). It
 * comes back after twice the TTL, and each time it has to step aside again it stays away twice
 * as long (at most 64 TTLs): the lanes it takes back wait while it fails. A step that ends
 * without a failure (a batch sent, or nothing to send) resets both.
 */
export interface StepAside {
  /** A step of the loop ended without a failure. */
  succeeded(): void;
  /** A send failed with `err`: whether it is time to step aside (if another relay is live). */
  failed(err: unknown): boolean;
  /** It stepped aside now: for how long (ms). */
  stepped(): number;
  /** Ms left before it takes lanes again (0: not aside). */
  readonly asideForMs: number;
}

export function stepAsidePolicy(ttlMs: number, now: () => number = () => performance.now()): StepAside {
  let failingSince: number | undefined;
  let asideUntil = 0;
  let asideMs = 2 * ttlMs;
  return {
    succeeded() {
      failingSince = undefined;
      asideMs = 2 * ttlMs;
    },
    failed(err) {
      if (!isBrokerUnreachable(err)) {
        failingSince = undefined; // the broker answered: about a message, which another relay would meet too
        return false;
      }
      failingSince ??= now();
      return now() - failingSince >= 2 * ttlMs;
    },
    stepped() {
      const ms = asideMs;
      failingSince = undefined;
      asideUntil = now() + ms;
      asideMs = Math.min(64 * ttlMs, asideMs * 2);
      return ms;
    },
    get asideForMs() {
      return Math.max(0, asideUntil - now());
    },
  };
}
