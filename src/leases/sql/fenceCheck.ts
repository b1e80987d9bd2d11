import { sql } from 'kysely';
import type { Executor } from '../../db/executor.js';

/**
 * What a write relies on: the lease of (task, branch) with this fencing token. A write that
 * carries a fence is refused (LeaseLostError) once another holder took the lease.
 */
export interface Fence {
  taskId: string;
  branch: string;
  fencingToken: number;
  /**
   * The lease's id, when the writer has it (a Lease does): checked too. A token alone can be
   * given out twice after an asynchronous failover (the promoted standby lost the first
   * acquisition and the sequence's last values); a lease id never is.
   */
  leaseId?: string | null;
}

/**
 * True when `fence` is still the current, unexpired lease of its (task, branch). Takes a
 * FOR SHARE lock on the lease row: a take-over (an UPDATE of that row) waits until the
 * caller's transaction ends, so the check stays true until the write it guards commits.
 */
export async function holdsFence(trx: Executor, fence: Fence): Promise<boolean> {
  const { rows } = await sql<{ ok: number }>`
    SELECT 1 AS ok FROM task_lease
     WHERE task_id = ${fence.taskId} AND branch = ${fence.branch}
       AND fencing_token = ${fence.fencingToken} AND holder IS NOT NULL AND expires_at > now()
       ${fence.leaseId ? sql`AND lease_id = ${fence.leaseId}::uuid` : sql``}
     FOR SHARE
  `.execute(trx);
  return rows.length === 1;
}
