import type { Db } from '../src/db/database.js';
import type { Logger } from '../src/logger.js';
import { deleteFenced } from './sql/deleteFenced.js';
import type { RelayStats } from './types.js';

type Row = { id: number; lane: number };

/**
 * Deleting what the broker acknowledged, one batch behind the publishing: while batch N+1 is
 * claimed and published, N's fenced delete runs; its rows stay out of claims until it is done.
 */
export interface DeletePipeline {
  /** Rows being deleted (or to be tried again): claims must not take them. */
  readonly inFlight: readonly Row[];
  /** Starts deleting `sent` under the lane tokens `fences` (and the rows waiting for another try). */
  start(sent: readonly Row[], fences: Map<number, number>): void;
  /** Waits for the delete in flight; rethrows its failure. */
  finish(): Promise<void>;
  /** Whether rows wait for another try (the WAL mode, when the stream has nothing to publish). */
  readonly retrying: boolean;
}

export function createDeletePipeline(o: {
  db: Db;
  instanceId: string;
  log: Logger;
  stats: RelayStats;
  /**
   * The WAL mode: a published row the delete did not find is tried again with the next delete
   * (up to 3 times), kept out of claims meanwhile. The walsender can hand over a commit a moment
   * before it is visible to other snapshots; deleting then finds nothing, and the sweep would
   * send the row a second time (measured: 9 of 1,100 rows at 1,000 msgs/s on a busy 2-core
   * machine, the WAL mode's p99).
   */
  retryMissed: boolean;
  timed<T>(p: Promise<T>): Promise<T>;
  /** A delete found rows of a lane this relay no longer holds: rebalance. */
  onLostLane(): Promise<void>;
}): DeletePipeline {
  let deleting: Promise<void> | undefined;
  let inFlight: Row[] = [];
  let retry: Row[] = [];
  /** The WAL mode: how often each row of `retry` was tried already. Only ids of `retry` are kept. */
  let attempts = new Map<number, number>();

  /**
   * Sorts the rows a delete did not find. A row of a lane no longer held was lost with its lane
   * (the new owner sends it again). A row of a lane still held was deleted by someone else
   * (`cairn outbox skip`, a tenant's DELETE): nothing to do, and no alarm a tenant could raise;
   * in the WAL mode it may also not be visible yet, so it is tried again (up to 3 times).
   */
  function sortMissed(tried: readonly Row[], missedIds: readonly number[], heldLanes: readonly number[]) {
    const missed = new Set(missedIds);
    const held = new Set(heldLanes);
    const next = new Map<number, number>();
    let lost = 0;
    let goneAlready = 0;
    for (const r of tried) {
      if (!missed.has(r.id)) continue;
      if (!held.has(r.lane)) {
        lost++;
        continue;
      }
      const n = (attempts.get(r.id) ?? 0) + 1;
      if (o.retryMissed && n < 3) {
        next.set(r.id, n);
        retry.push(r);
      } else goneAlready++;
    }
    attempts = next;
    return { lost, goneAlready };
  }

  return {
    get inFlight() {
      return inFlight;
    },
    get retrying() {
      return retry.length > 0;
    },
    start(sent, fences) {
      const tried = [...sent, ...retry];
      retry = [];
      inFlight = tried;
      const ids = tried.map((r) => r.id);
      deleting = deleteFenced(o.db, { instanceId: o.instanceId, ids, fences }).then(
        async ({ missed, heldLanes }) => {
          if (missed.length === 0) {
            attempts.clear();
            return;
          }
          const { lost, goneAlready } = sortMissed(tried, missed, heldLanes);
          if (goneAlready > 0) {
            o.stats.goneBeforeDelete += goneAlready;
            o.log.debug(
              { rows: goneAlready },
              'published rows were gone from the outbox already (skipped or deleted by a tenant)',
            );
          }
          if (lost > 0) {
            // We lost a lane between claim and delete: the new owner republishes those rows (same message_id).
            o.stats.lostLaneDeletes += lost;
            o.log.warn(
              { published: ids.length, deleted: ids.length - missed.length },
              'lost a lane during a batch; rebalancing',
            );
            await o.onLostLane();
          }
        },
        (error: unknown) => {
          // Nothing is known of these rows: claims may take them again (finish), counts start over.
          attempts.clear();
          throw error;
        },
      );
      // Awaited by finish (which rethrows); meanwhile a failure must not be an unhandled
      // rejection, which ends the process while the loop waits on the broker.
      deleting.catch(() => {});
    },
    async finish() {
      const d = deleting;
      deleting = undefined;
      try {
        if (d) await o.timed(d);
      } finally {
        // Also when it failed: its rows are claimable again (the sweep or the new owner sends them).
        inFlight = [...retry];
      }
    },
  };
}
