import { sql } from 'kysely';
import type { Executor } from '../../db/executor.js';

/**
 * The compare-and-swap. One statement: `WHERE version = $expected` decides the race. Under
 * READ COMMITTED a second writer that named the same version blocks on the row lock, then
 * re-checks the WHERE against the committed row, finds the new version and updates 0 rows:
 * no last-write-wins. The row's trigger (migration 0001) re-checks version + 1, terminal
 * states and the transition table in SQL.
 */
export async function casUpdate(
  db: Executor,
  row: { taskId: string; expectedVersion: number; status: string; schemaVersion: string; doc: unknown },
): Promise<boolean> {
  const result = await sql`
    UPDATE task_state
       SET version = version + 1,
           status = ${row.status},
           schema_version = ${row.schemaVersion},
           doc = ${JSON.stringify(row.doc)}::jsonb,
           updated_at = now()
     WHERE task_id = ${row.taskId} AND version = ${row.expectedVersion}
  `.execute(db);
  return Number(result.numAffectedRows ?? 0) === 1;
}
