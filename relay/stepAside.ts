import { isBrokerUnreachable } from '../src/kafka/classifyError.js';

/**
 * When a relay that cannot reach the broker gives its lanes to the others. A relay that alone
 * cannot reach it (its network, a producer stuck) kept its lanes, renewing them in Postgres,
 * and their messages waited for good while other relays could send them. After twice the lease
 * TTL of sends failing because the broker could not be reached (isBrokerUnreachable: not a
 * broker's answer about a message or a topic, which would follow the lane to any relay), the
 * relay steps aside if another relay is live (relay/sql/laneLeases.ts stepAsideIfOthersLive). It
 * comes back after twice the TTL, and each time it has to step aside again it stays away twice
 * as long (at most 64 TTLs): the lanes it takes back wait while it fails. Only a batch sent resets
 * the backoff: a relay back from aside gets no lanes at first, and its empty steps used to reset it:
 * one cut off for good came back every 4 TTLs (review). A step with nothing to send resets the
 * failure clock only once the last failure is a TTL old: one failure, an hour of idling and one
 * more failure must not step aside at once, but the empty steps between two failures (the WAL
 * mode's sweep of an empty table after a failed send) must not hide an outage either.
 */
export interface StepAside {
  /** A step of the loop sent a batch to the broker. */
  sent(): void;
  /** A step of the loop ended with nothing to send (and no failure). */
  idle(): void;
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
  let lastFailure = Number.NEGATIVE_INFINITY;
  return {
    sent() {
      failingSince = undefined;
      asideMs = 2 * ttlMs;
    },
    idle() {
      if (now() - lastFailure >= ttlMs) failingSince = undefined;
    },
    failed(err) {
      if (!isBrokerUnreachable(err)) {
        failingSince = undefined; // the broker answered: about a message, which another relay would meet too
        return false;
      }
      lastFailure = now();
      failingSince ??= lastFailure;
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
