import type { Db } from '../src/db/database.js';
import type { Logger } from '../src/logger.js';
import { LanesUnknownError } from './publishBatch.js';
import { renewLanes, shareLanes, touchInstance } from './sql/laneLeases.js';
import type { RelayStats } from './types.js';

/**
 * The lanes a relay holds and the fencing token of each, as the database's leases say: its
 * share taken at each rebalance, the leases extended through long steps, a lane dropped once
 * lost. The relay reads `owned` afresh each time: it changes under it.
 */
export interface HeldLanes {
  /** lane -> fencing token. */
  readonly owned: ReadonlyMap<number, number>;
  /** Says this relay is alive, renews its leases, takes its share of the lanes (relay/sql/laneLeases.ts). */
  rebalance(): Promise<void>;
  /**
   * In a long step (an isolation, a park, retries): extends the leases when due (a third of the
   * TTL since the last renewal) and says this relay is alive, so a relay slow, not dead, keeps
   * its lanes. A lease already run out is not extended: that lane is dropped. Rejects with a
   * LanesUnknownError when Postgres does not answer.
   */
  keep(): Promise<void>;
  /** A fenced delete missed a lane: the leases read again (the lost ones dropped). */
  renew(): Promise<void>;
  /** Holds nothing any more (stepped aside, stopped); the rows were released by the caller. */
  drop(): void;
}

export function createHeldLanes(o: {
  db: Db;
  instanceId: string;
  ttlMs: number;
  renewEveryMs: number;
  log: Logger;
  stats: RelayStats;
}): HeldLanes {
  let owned = new Map<number, number>();
  // When the last renewal was asked for (a monotonic clock: a wall clock may step back). The
  // lease runs from the database's now() at the query, not from the answer: a relay slow to
  // get the answer trusted the lease for a third of the TTL past its end (review: it sent a
  // lost lane's message again after the new owner's).
  let lastRenewal = Number.NEGATIVE_INFINITY;
  // One query at a time, each answer applied before the next is asked: a delete's renew()
  // answered after the loop's rebalance brought back a lane the rebalance had released, under
  // its old token (review).
  let queue: Promise<unknown> = Promise.resolve();
  const serially = <T>(f: () => Promise<T>): Promise<T> => {
    const next = queue.then(f);
    queue = next.catch(() => {});
    return next;
  };
  const set = (next: Map<number, number>) => {
    owned = next;
    o.stats.lanesOwned = owned.size;
  };
  return {
    get owned() {
      return owned;
    },
    rebalance: () =>
      serially(async () => {
        const asked = performance.now();
        set(await shareLanes(o.db, o));
        lastRenewal = asked;
      }),
    async keep() {
      if (performance.now() - lastRenewal < o.renewEveryMs) return;
      await serially(async () => {
        if (performance.now() - lastRenewal < o.renewEveryMs) return; // renewed while waiting
        const asked = performance.now();
        try {
          await touchInstance(o.db, o.instanceId);
          set(await renewLanes(o.db, o.instanceId, o.ttlMs));
        } catch (err) {
          throw new LanesUnknownError(err);
        }
        lastRenewal = asked;
      });
    },
    renew: () =>
      serially(async () => {
        set(await renewLanes(o.db, o.instanceId, o.ttlMs));
      }),
    drop() {
      set(new Map());
    },
  };
}
