import { sql } from 'kysely';
import type { Executor } from '../../db/executor.js';
import type { ReceiptStatus } from '../../db/types.js';
import type { Lease } from '../../leases/leases.js';

/** Takes a receipt back to `started` for another attempt, if it is still in `from`; returns the new attempt. */
export async function reclaimReceipt(
  db: Executor,
  a: { receiptId: string; from: ReceiptStatus; worker: string; lease?: Lease },
): Promise<number | undefined> {
  const row = await db
    .updateTable('tool_receipt')
    .set((eb) => ({
      status: 'started',
      attempt: eb('attempt', '+', 1),
      worker: a.worker,
      error: null,
      lease_task_id: a.lease?.taskId ?? null,
      lease_branch: a.lease?.branch ?? null,
      lease_id: a.lease?.leaseId ?? null,
      fencing_token: a.lease?.fencingToken ?? null,
      started_at: sql<Date>`now()`,
      // A new attempt is unfinished: the failure's time made the changelog take it as settled.
      finished_at: null,
    }))
    .where('receipt_id', '=', a.receiptId)
    .where('status', '=', a.from)
    .returning('attempt')
    .executeTakeFirst();
  return row?.attempt;
}
