import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';
import { intArray } from './intArray.js';

/**
 * Deletes published rows, but only of lanes this instance still owns with the token it
 * claimed them under: a relay that lost a lane (paused, partitioned, slow) cannot delete
 * rows that the new owner is responsible for. Returns the ids it did not delete (none,
 * usually: then no id list comes back at all) and the lanes it still held: a row missing from
 * a held lane was deleted by someone else (`cairn outbox skip`, a tenant's own DELETE) or, in
 * the WAL mode, is not visible yet; only a row of a lane no longer held means the lane was lost.
 *
 * The fence is checked once per lane (FOR SHARE, so a take-over waits for this statement),
 * and `lane + 0` keeps the planner on the primary key: joining on `lane` made it probe the
 * (lane, id) index once per lane with the whole id list, 24 ms per 1,000 rows on a 200k
 * backlog instead of 3 ms (EXPLAIN ANALYZE on the dev machine).
 *
 * The valid lanes are one array (an InitPlan, run once), not `IN (SELECT lane FROM valid)`:
 * the planner guesses one row for a locking CTE, so it made the lanes the outer side of a
 * nested loop and probed the primary key with the whole id list once per owned lane (32
 * lanes: 80,000 probes, 244k buffers, 318 ms for a 2,500-row delete on a 200k backlog; now
 * 2,500 probes, 7.7k buffers, 12 ms; EXPLAIN ANALYZE BUFFERS on the 2-core dev machine).
 *
 * Only the ids NOT deleted come back, and only when there are some: returning every deleted
 * id (array_agg, a 2,500-element bigint[] as text) was ~9% of the bytes the relay's drain
 * allocated in Node (postgres-array's parse; heap sampling profile, confluent client).
 */
export async function deleteFenced(
  db: Executor,
  args: { instanceId: string; ids: readonly number[]; fences: ReadonlyMap<number, number> },
): Promise<{ missed: number[]; heldLanes: number[] }> {
  if (args.ids.length === 0) return { missed: [], heldLanes: [] };
  const lanes = [...args.fences.keys()];
  const tokens = lanes.map((l) => args.fences.get(l)!);
  const ids = intArray(args.ids);
  const { rows } = await sql<{ missed: number[] | null; held_lanes: number[] | null }>`
    WITH valid AS (
      SELECT l.lane FROM relay_lane l
       WHERE l.owner = ${args.instanceId}
         AND l.expires_at > now()
         AND (l.lane, l.fencing_token) IN (SELECT * FROM unnest(${intArray(lanes)}::int[], ${intArray(tokens)}::bigint[]))
         FOR SHARE
    ), deleted AS (
      DELETE FROM outbox o
       WHERE o.id = ANY(${ids}::bigint[])
         AND (o.lane + 0) = ANY(ARRAY(SELECT lane FROM valid))
      RETURNING o.id
    )
    SELECT CASE WHEN (SELECT count(*) FROM deleted) = ${args.ids.length}::int THEN NULL
                ELSE (SELECT array_agg(i) FROM unnest(${ids}::bigint[]) AS i
                       WHERE i NOT IN (SELECT id FROM deleted)) END AS missed,
           (SELECT array_agg(lane) FROM valid) AS held_lanes
  `.execute(db);
  return { missed: (rows[0]?.missed ?? []).map(Number), heldLanes: rows[0]?.held_lanes ?? [] };
}
