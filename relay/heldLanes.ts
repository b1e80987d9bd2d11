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
  let lastRenewal = Number.NEGATIVE_INFINITY; // a monotonic clock: a wall clock may step back
  const set = (next: Map<number, number>) => {
    owned = next;
    o.stats.lanesOwned = owned.size;
  };
  return {
    get owned() {
      return owned;
    },
    async rebalance() {
      set(await shareLanes(o.db, o));
      lastRenewal = performance.now();
    },
    async keep() {
      if (performance.now() - lastRenewal < o.renewEveryMs) return;
      try {
        await touchInstance(o.db, o.instanceId);
        set(await renewLanes(o.db, o.instanceId, o.ttlMs));
      } catch (err) {
        throw new LanesUnknownError(err);
      }
      lastRenewal = performance.now();
    },
    async renew() {
      set(await renewLanes(o.db, o.instanceId, o.ttlMs));
    },
    drop() {
      set(new Map());
    },
  };
}
