/**
 * When a relay whose batches do not reach the broker gives its lanes to the others. A relay
 * that alone cannot reach the broker (its network, a producer stuck) kept its lanes, renewing
 * them in Postgres, and their messages waited for good while other relays could send them.
 * After twice the lease TTL without an acknowledged batch, while another relay is live, it
 * steps aside; it comes back after twice the TTL and tries again, and each time it has to step
 * aside again it stays away twice as long (at most 64 TTLs): the lanes it takes back wait while
 * it fails. A success resets both.
 */
export interface StepAside {
  /** A batch reached the broker. */
  published(): void;
  /** A batch did not: whether it is time to step aside (`othersLive` is asked only then). */
  failed(othersLive: () => Promise<number>): Promise<boolean>;
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
    published() {
      failingSince = undefined;
      asideMs = 2 * ttlMs;
    },
    async failed(othersLive) {
      failingSince ??= now();
      return now() - failingSince >= 2 * ttlMs && (await othersLive().catch(() => 0)) > 0;
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
