import { type RawBuilder, sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';
import { intArray } from '../sql/intArray.js';

/**
 * A CTE body widening 32-bit xids (as pgoutput gives them) to xid8, around the snapshot's
 * xmax: the full xid is xmax plus the signed 32-bit distance from xmax's low 32 bits, so it
 * holds in every epoch (a transaction just committed, still in the proc array, is at or above
 * xmax: the same epoch, not the one before). Columns: xid (xid8), snap (the snapshot).
 */
export function fullXids(xids: readonly number[]): RawBuilder<unknown> {
  return sql`
    SELECT s.snap,
           (s.xmax + (((v - (s.xmax & 4294967295)) + 2147483648) % 4294967296 + 4294967296) % 4294967296
                   - 2147483648)::text::xid8 AS xid
      FROM (SELECT pg_current_snapshot() AS snap,
                   pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax) s,
           unnest(${intArray(xids)}::bigint[]) AS v`;
}

/**
 * Whether every one of these transactions is visible to a snapshot taken now. The walsender
 * sends a commit once its WAL is flushed, which is before the committing backend leaves the
 * proc array: for that moment a new snapshot still sees the transaction as running, and its
 * rows as absent.
 */
export async function allVisible(db: Executor, xids: readonly number[]): Promise<boolean> {
  if (xids.length === 0) return true;
  const { rows } = await sql<{ visible: boolean }>`
    WITH x AS (${fullXids(xids)})
    SELECT coalesce(bool_and(pg_visible_in_snapshot(x.xid, x.snap)), true) AS visible FROM x`.execute(db);
  return rows[0]!.visible;
}
