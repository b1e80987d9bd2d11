import { sql } from 'kysely';
import type { Executor } from '../../db/executor.js';

/**
 * Takes the lease of (task, branch) if nobody holds it or the holder's lease expired by the
 * database clock, with a new fencing token: the next of one sequence (migration 0016), so a
 * task deleted and created again under its id never gives a token an earlier holder had. One
 * statement: two agents racing for the same lease serialize on the row, and only the first
 * sees it free.
 */
export async function acquireLease(
  db: Executor,
  a: { taskId: string; branch: string; holder: string; leaseId: string; ttlMs: number },
): Promise<{ fencing_token: number; expires_at: Date } | undefined> {
  const { rows } = await sql<{ fencing_token: number; expires_at: Date }>`
    INSERT INTO task_lease (task_id, branch, holder, lease_id, fencing_token, expires_at)
    VALUES (${a.taskId}, ${a.branch}, ${a.holder}, ${a.leaseId}::uuid, nextval('lease_token'), now() + make_interval(secs => ${a.ttlMs / 1000}))
    ON CONFLICT (task_id, branch) DO UPDATE
       SET holder = EXCLUDED.holder, lease_id = EXCLUDED.lease_id,
           fencing_token = greatest(task_lease.fencing_token + 1, nextval('lease_token')),
           acquired_at = now(), expires_at = EXCLUDED.expires_at
     WHERE task_lease.holder IS NULL OR task_lease.expires_at <= now()
    RETURNING fencing_token, expires_at
  `.execute(db);
  return rows[0];
}
