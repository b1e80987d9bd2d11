import { sql } from 'kysely';
import type { Db } from '../db/database.js';
import { CairnError, CairnErrorCodes, LeaseLostError } from '../errors.js';
import type { Lease } from '../leases/leases.js';
import { holdsFence } from '../leases/sql/fenceCheck.js';
import { activeHold } from '../recovery/quarantine.js';
import type { ReceiptRow, ReceiptStore, ReconcileAction, RunOnceInput, RunOnceResult } from './types.js';

/** What reconcile needs of its receipt store. */
export interface ReconcileDeps {
  db: Db;
  byTask(taskId: string): Promise<ReceiptRow[]>;
  ownerAlive(receiptId: string): Promise<boolean>;
  resolveUncertain<T>(input: RunOnceInput<T>, row: ReceiptRow, worker: string): Promise<RunOnceResult<T>>;
  worker: string;
}

/** Nothing of a task held after a failover is settled (its receipts stay as they were held). */
async function refuseHeld(d: ReconcileDeps, taskId: string, receiptId: string): Promise<void> {
  const held = await activeHold(d.db, taskId);
  if (held) {
    throw new CairnError(
      CairnErrorCodes.Quarantined,
      `reconcile of task ${taskId}: the task is held (${held.reason}); receipt ${receiptId} was left as it is`,
    );
  }
}

/** What a receipt another worker moved meanwhile now means for a resume. */
function actionOf(status: ReceiptRow['status'] | undefined): ReconcileAction {
  if (status === 'succeeded') return 'skip';
  if (status === 'failed') return 'may_run';
  if (status === 'compensated' || status === 'gated') return 'settled';
  return 'in_progress';
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
  const all = await d.byTask(taskId);
  for (const r of all) {
    if (r.step.endsWith('/compensate')) continue; // settled through the receipt it compensates
    const entry = { receiptId: r.receipt_id, tool: r.tool, step: r.step };
    if (r.status !== 'started' && r.status !== 'uncertain' && r.status !== 'compensating')
      out.push({ ...entry, action: actionOf(r.status) });
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
        await refuseHeld(d, taskId, r.receipt_id);
        // That attempt only: a live worker may have taken the receipt back meanwhile (a new
        // attempt under its own lease), and its effect is running.
        const marked = await d.db
          .updateTable('tool_receipt')
          .set({ status: 'uncertain', finished_at: sql<Date>`now()` })
          .where('receipt_id', '=', r.receipt_id)
          .where('status', '=', 'started')
          .where('attempt', '=', r.attempt)
          .returning('receipt_id')
          .executeTakeFirst();
        if (!marked) {
          const now = (await d.byTask(taskId)).find((x) => x.receipt_id === r.receipt_id);
          // Its worker woke, found its effect cut off and left that attempt uncertain for the
          // lease holder: settled here. Anything else moved it on (a new attempt, a success).
          if (now?.status !== 'uncertain' || now.attempt !== r.attempt) {
            out.push({ ...entry, action: actionOf(now?.status) });
            continue;
          }
        }
      }
      const compensate = opts.compensators?.[r.tool];
      if (r.status === 'compensating' && !compensate) {
        out.push({ ...entry, action: 'in_progress' });
        continue;
      }
      // The tool applies its key once: the worker's runOnce (onUncertain 'retry') runs it again.
      // Not once a compensation was tried (it failed: the receipt went back to uncertain): the
      // effect was meant to be undone, not done again; a human decides.
      const undoTried = all.some((c) => c.step === `${r.step}/compensate`);
      if (
        !compensate &&
        r.status !== 'compensating' &&
        !undoTried &&
        opts.idempotentTools?.includes(r.tool)
      ) {
        out.push({ ...entry, action: 'retry' });
        continue;
      }
      const input = {
        taskId,
        step: r.step,
        tool: r.tool,
        args: null,
        effect: async (): Promise<never> => {
          throw new CairnError(CairnErrorCodes.InvariantViolated, 'reconcile never runs an effect');
        },
        // The compensation runs under the caller's lease: it does not start once lost.
        ...(fence && 'leaseId' in fence ? { lease: fence as Lease } : {}),
        ...(opts.gate ? { gate: opts.gate } : {}),
      };
      await refuseHeld(d, taskId, r.receipt_id);
      let settled = await d.resolveUncertain(
        { ...input, onUncertain: compensate ? 'compensate' : 'gate', ...(compensate ? { compensate } : {}) },
        { ...r, status: r.status === 'compensating' ? 'compensating' : 'uncertain' },
        d.worker,
      );
      if (settled.status === 'failed') {
        // The compensation failed (the receipt is uncertain again): a human decides; gated, as
        // the plan says, so no worker's retry runs the effect it was meant to undo.
        // The compensation may have run long: the lease and the hold are looked at again first.
        if (fence && !(await holdsFence(d.db, fence))) {
          throw new LeaseLostError(
            `reconcile of task ${taskId}: lease token ${fence.fencingToken} is no longer current; receipt ${r.receipt_id} was left uncertain`,
          );
        }
        await refuseHeld(d, taskId, r.receipt_id);
        const now = (await d.byTask(taskId)).find((x) => x.receipt_id === r.receipt_id) ?? r;
        if (now.status === 'uncertain')
          settled = await d.resolveUncertain({ ...input, onUncertain: 'gate' }, now, d.worker);
      }
      out.push({ ...entry, action: settled.status === 'compensated' ? 'compensated' : 'gated' });
    }
  }
  return out;
}
