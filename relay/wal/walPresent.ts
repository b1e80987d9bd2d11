import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';
import { intArray } from '../sql/intArray.js';

/**
 * Which of these streamed rows the outbox still has, asked in a snapshot that sees all their
 * transactions (`visible: false` when one is not visible yet: ask again). The stream also
 * hands over rows the table no longer has, or never had for anyone else: published and
 * deleted before a crash or by another relay, dropped by `cairn outbox skip`, deleted by the
 * transaction that inserted them. Only what the table still has may be published.
 */
export async function presentRows(
  db: Executor,
  ids: readonly number[],
  xids: readonly number[],
): Promise<{ visible: boolean; present: Set<number> }> {
  const { rows } = await sql<{ visible: boolean; present: string[] | null }>`
    WITH s AS (SELECT pg_current_snapshot() AS snap,
                      pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax),
         x AS (SELECT (((s.xmax >> 32) - CASE WHEN v > (s.xmax & 4294967295) THEN 1 ELSE 0 END) << 32 | v)::text::xid8 AS xid
                 FROM s, unnest(${intArray(xids)}::bigint[]) AS v)
    SELECT (SELECT coalesce(bool_and(pg_visible_in_snapshot(x.xid, s.snap)), true) FROM x, s) AS visible,
           (SELECT array_agg(o.id::text) FROM outbox o WHERE o.id = ANY(${intArray(ids)}::bigint[])) AS present`.execute(
    db,
  );
  const r = rows[0]!;
  return { visible: r.visible, present: new Set((r.present ?? []).map(Number)) };
}
