import type { Db } from '../db/database.js';
import { LeaseLostError, StaleWriteError } from '../errors.js';
import { holdsFence } from '../leases/sql/fenceCheck.js';
import { refuseUnknownKeys } from '../options.js';
import { TERMINAL } from '../state/transitions.js';
import type { ReceiptRow, RunOnceInput } from './types.js';

/** How often the gate's audit write reads the task again when another write took its version. */
const AUDIT_ROUNDS = 5;

/**
 * Gates an uncertain receipt: it waits for a human, and the task's audit log says so. One
 * transaction, under the caller's lease when it has one (the gate's, or the run's): a resume
 * or reconcile paused past its lease gates nothing once another holds the task, and the receipt
 * is never gated without its audit row (a write to the task between the read and the audit
 * write took its version: read again; a kill between the two commits neither). False when the
 * receipt is no longer uncertain (someone else moved it).
 */
export async function gateUncertain<T>(db: Db, input: RunOnceInput<T>, row: ReceiptRow): Promise<boolean> {
  if (input.gate)
    refuseUnknownKeys('gate record', input.gate, ['store', 'actor', 'lease'], { fence: 'lease' });
  const fence = input.gate?.lease ?? input.lease;
  return db.transaction().execute(async (trx) => {
    if (fence && !(await holdsFence(trx, fence))) {
      throw new LeaseLostError(
        `receipt ${row.receipt_id} of task ${input.taskId}: lease token ${fence.fencingToken} is no longer current; not gated, left uncertain for the holder`,
      );
    }
    const gated = await trx
      .updateTable('tool_receipt')
      .set({ status: 'gated', resolution: 'waiting for a human decision' })
      .where('receipt_id', '=', row.receipt_id)
      .where('status', '=', 'uncertain')
      .returning('receipt_id')
      .executeTakeFirst();
    if (!gated || !input.gate) return gated !== undefined;
    for (let round = 1; ; round++) {
      const task = await input.gate.store.get(input.taskId, { trx });
      // A task that ended (complete, failed, cancelled, expired) never changes again, an audit
      // row included: the receipt alone says a human decides (review: refused, the gate rolled
      // back and left the receipt uncertain, open to a retry that runs the effect again).
      if (!task || TERMINAL.has(task.status)) return true;
      const r = await input.gate.store.update({
        taskId: input.taskId,
        expectedVersion: task.version,
        patch: {},
        actor: input.gate.actor,
        reason: `human decision required: receipt ${row.receipt_id} (${input.tool} at ${input.step}) is uncertain after its worker died`,
        ...(input.gate.lease ? { lease: input.gate.lease } : {}),
        trx,
      });
      if (r.ok) return true;
      if (round === AUDIT_ROUNDS) throw new StaleWriteError(input.taskId, task.version, r.currentVersion);
    }
  });
}
