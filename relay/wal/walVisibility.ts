import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';
import { intArray } from '../sql/intArray.js';

/**
 * Whether every one of these transactions (32-bit xids, as pgoutput gives them) is visible
 * to a snapshot taken now. The walsender sends a commit once its WAL is flushed, which is
 * before the committing backend leaves the proc array: for that moment a new snapshot still
 * sees the transaction as running, and its rows as absent. Each xid is widened to its
 * 64-bit form with the epoch of the snapshot's xmax (an xid above xmax's low 32 bits is of
 * the epoch before).
 */
export async function allVisible(db: Executor, xids: readonly number[]): Promise<boolean> {
  if (xids.length === 0) return true;
  const { rows } = await sql<{ visible: boolean }>`
    WITH s AS (SELECT pg_current_snapshot() AS snap,
                      pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax),
         x AS (SELECT (((s.xmax >> 32) - CASE WHEN v > (s.xmax & 4294967295) THEN 1 ELSE 0 END) << 32 | v)::text::xid8 AS xid
                 FROM s, unnest(${intArray(xids)}::bigint[]) AS v)
    SELECT coalesce(bool_and(pg_visible_in_snapshot(x.xid, s.snap)), true) AS visible FROM x, s`.execute(db);
  return rows[0]!.visible;
}
