import type { Db } from '../db/database.js';
import { CairnError, CairnErrorCodes, LeaseLostError } from '../errors.js';
import type { Lease } from '../leases/leases.js';
import { holdsFence } from '../leases/sql/fenceCheck.js';
import type { ReceiptRow, ReceiptStore, ReconcileAction, RunOnceInput, RunOnceResult } from './types.js';

/** What reconcile needs of its receipt store. */
export interface ReconcileDeps {
  db: Db;
  byTask(taskId: string): Promise<ReceiptRow[]>;
  ownerAlive(receiptId: string): Promise<boolean>;
  resolveUncertain<T>(input: RunOnceInput<T>, row: ReceiptRow, worker: string): Promise<RunOnceResult<T>>;
  worker: string;
}

/**
 * ReceiptStore.reconcile: what each receipt of a task means for a resume (skip, may run, in
 * progress, settled), settling the uncertain ones (compensate, leave for a retry, or gate) on the way.
 */
export async function reconcileTask(
  d: ReconcileDeps,
  taskId: string,
  opts: Parameters<ReceiptStore['reconcile']>[1],
): Promise<Array<{ receiptId: string; tool: string; step: string; action: ReconcileAction }>> {
  const out: Array<{ receiptId: string; tool: string; step: string; action: ReconcileAction }> = [];
  for (const r of await d.byTask(taskId)) {
    if (r.step.endsWith('/compensate')) continue; // settled through the receipt it compensates
    const entry = { receiptId: r.receipt_id, tool: r.tool, step: r.step };
    if (r.status === 'succeeded') out.push({ ...entry, action: 'skip' });
    else if (r.status === 'failed') out.push({ ...entry, action: 'may_run' });
    else if (r.status === 'compensated' || r.status === 'gated') out.push({ ...entry, action: 'settled' });
    else {
      // A caller that holds the task's lease (resume) settles receipts only while it still
      // does: one paused past its lease must not mark, gate or compensate another
      // holder's receipts (the gate's audit row would be refused after the receipt moved).
      const fence = opts.lease ?? opts.gate?.lease;
      if (fence && !(await holdsFence(d.db, fence))) {
        throw new LeaseLostError(
          `reconcile of task ${taskId}: lease token ${fence.fencingToken} is no longer current; receipt ${r.receipt_id} was left as it is`,
        );
      }
      if (r.status === 'started') {
        if (await d.ownerAlive(r.receipt_id)) {
          out.push({ ...entry, action: 'in_progress' });
          continue;
        }
        await d.db
          .updateTable('tool_receipt')
          .set({ status: 'uncertain' })
          .where('receipt_id', '=', r.receipt_id)
          .where('status', '=', 'started')
          .execute();
      }
      const compensate = opts.compensators?.[r.tool];
      if (r.status === 'compensating' && !compensate) {
        out.push({ ...entry, action: 'in_progress' });
        continue;
      }
      if (!compensate && r.status !== 'compensating' && opts.idempotentTools?.includes(r.tool)) {
        // The tool applies its key once: the worker's runOnce (onUncertain 'retry') runs it again.
        out.push({ ...entry, action: 'retry' });
        continue;
      }
      const settled = await d.resolveUncertain(
        {
          taskId,
          step: r.step,
          tool: r.tool,
          args: null,
          effect: async () => {
            throw new CairnError(CairnErrorCodes.InvariantViolated, 'reconcile never runs an effect');
          },
          onUncertain: compensate ? 'compensate' : 'gate',
          ...(compensate ? { compensate } : {}),
          // The compensation runs under the caller's lease: it does not start once lost.
          ...(fence && 'leaseId' in fence ? { lease: fence as Lease } : {}),
          ...(opts.gate ? { gate: opts.gate } : {}),
        },
        { ...r, status: r.status === 'compensating' ? 'compensating' : 'uncertain' },
        d.worker,
      );
      out.push({ ...entry, action: settled.status === 'compensated' ? 'compensated' : 'gated' });
    }
  }
  return out;
}
