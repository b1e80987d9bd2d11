/**
 * Which tasks retention deleted, from the deletion certificates it committed with each batch
 * (src/retention/retention.ts): a task's rows go, its certificate names it (tenant, id, the
 * version it was at) and stays. Messages of such a task outlive it on a topic until the
 * topic's own retention drops them; the failover check must not take them for lost work.
 */
import { sql } from 'kysely';
import type { Db } from '../db/database.js';

export const retentionKey = (tenant: string | null, taskId: string) => `${tenant ?? ''}\u0000${taskId}`;

/**
 * For each of `tasks` that a deletion certificate of its tenant names: the highest version it
 * was deleted at, keyed by `retentionKey`. One array parameter, however many tasks.
 */
export async function deletedByRetention(
  db: Db,
  tasks: ReadonlyArray<{ tenant: string | null; taskId: string }>,
): Promise<Map<string, number>> {
  if (tasks.length === 0) return new Map();
  const ids = [...new Set(tasks.map((t) => t.taskId))];
  // No index: certificates are few (one per retention batch) and the check runs once per failover.
  const { rows } = await sql<{ tenant_id: string; task_id: string; version: number }>`
    SELECT c.tenant_id, t->>'task_id' AS task_id, max((t->>'version')::int) AS version
      FROM deletion_certificate c
      CROSS JOIN LATERAL jsonb_array_elements(c.body->'tasks') t
     WHERE t->>'task_id' = ANY(${ids}::text[])
     GROUP BY c.tenant_id, t->>'task_id'`.execute(db);
  const wanted = new Set(tasks.map((t) => retentionKey(t.tenant, t.taskId)));
  const out = new Map<string, number>();
  for (const r of rows) {
    const k = retentionKey(r.tenant_id, r.task_id);
    if (wanted.has(k)) out.set(k, Number(r.version));
  }
  return out;
}
