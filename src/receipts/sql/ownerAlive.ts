import { sql } from 'kysely';
import type { Executor } from '../../db/executor.js';

/**
 * Is the worker that left this receipt `started` still alive? With a lease: the lease is
 * still that worker's and unexpired. Without: it started less than `abandonAfterMs` ago.
 * Both by the database clock.
 */
export async function receiptOwnerAlive(
  db: Executor,
  receiptId: string,
  abandonAfterMs: number,
): Promise<boolean> {
  const { rows } = await sql<{ alive: boolean }>`
    SELECT CASE
             WHEN r.lease_id IS NULL THEN r.started_at > now() - make_interval(secs => ${abandonAfterMs / 1000})
             ELSE EXISTS (SELECT 1 FROM task_lease l
                           WHERE l.task_id = r.lease_task_id AND l.branch = r.lease_branch
                             AND l.lease_id = r.lease_id AND l.holder IS NOT NULL AND l.expires_at > now())
           END AS alive
      FROM tool_receipt r WHERE r.receipt_id = ${receiptId}::uuid
  `.execute(db);
  return rows[0]?.alive ?? false;
}
