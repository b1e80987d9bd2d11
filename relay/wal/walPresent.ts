import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';
import { intArray } from '../sql/intArray.js';
import { fullXids } from './walVisibility.js';

/**
 * Which of these streamed rows the outbox still has, asked in a snapshot that sees all their
 * transactions (`visible: false` when one is not visible yet: ask again). The stream also
 * hands over rows the table no longer has, or never had for anyone else: published and
 * deleted before a crash or by another relay, dropped by `cairn outbox skip`, deleted by the
 * transaction that inserted them. Only what the table still has may be published.
 * (pg_current_snapshot() is the statement's snapshot, the one the outbox subquery reads.)
 */
export async function presentRows(
  db: Executor,
  ids: readonly number[],
  xids: readonly number[],
): Promise<{ visible: boolean; present: Set<number> }> {
  const { rows } = await sql<{ visible: boolean; present: string[] | null }>`
    WITH x AS (${fullXids(xids)})
    SELECT (SELECT coalesce(bool_and(pg_visible_in_snapshot(x.xid, x.snap)), true) FROM x) AS visible,
           (SELECT array_agg(o.id::text) FROM outbox o WHERE o.id = ANY(${intArray(ids)}::bigint[])) AS present`.execute(
    db,
  );
  const r = rows[0]!;
  return { visible: r.visible, present: new Set((r.present ?? []).map(Number)) };
}
