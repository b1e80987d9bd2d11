import { sql } from 'kysely';
import { digestOf } from '../canonical.js';
import type { Db } from '../db/database.js';
import { LeaseLostError } from '../errors.js';
import { holdsFence } from '../leases/sql/fenceCheck.js';
import type { Logger } from '../logger.js';
import type { ReceiptRow, ReceiptTestHooks, Ref, RunOnceInput, RunOnceResult } from './types.js';

/**
 * The two protocols where a receipt can be moved by two workers at once: a slow worker's
 * late success, and a compensation. Every status change is a claimed transition (checked
 * by its row count), and migration 0008's receipt guard refuses any other in SQL.
 */
export interface ReceiptContext {
  db: Db;
  log: Logger;
  hooks: ReceiptTestHooks;
  load(key: string, taskId?: string): Promise<ReceiptRow | undefined>;
  runOnce<T>(input: RunOnceInput<T>): Promise<RunOnceResult<T>>;
}

/**
 * This worker's effect ran, but the receipt moved on while it did (its lease lapsed: it was
 * slow, not dead). If another worker is compensating, or has compensated, the world now
 * holds both the effect and its undoing in an order nobody knows: only a human can tell,
 * so the receipt is gated with the conflict named. Otherwise what is recorded stands.
 */
export async function lateSuccess<T>(
  ctx: ReceiptContext,
  input: RunOnceInput<T>,
  ref: Ref,
  attempt: number,
  result: T,
): Promise<RunOnceResult<T>> {
  const conflict = await ctx.db
    .updateTable('tool_receipt')
    .set({
      status: 'gated',
      // Added to what the receipt says (how it was compensated), never in its place.
      resolution: sql<string>`coalesce(resolution || '; ', '') || ${
        `conflict: attempt ${attempt} of ${input.tool} at ${input.step} reported success after the receipt ` +
        'was taken for compensation; check what the world holds and resolve the gate'
      }`,
    })
    .where('receipt_id', '=', ref.receiptId)
    .where('status', 'in', ['compensating', 'compensated'])
    .returning('receipt_id')
    .executeTakeFirst();
  if (conflict) {
    ctx.log.error(
      { task_id: input.taskId, receipt_id: ref.receiptId, attempt },
      'effect succeeded after its compensation started; receipt gated for a human',
    );
    return { ...ref, status: 'gated' };
  }
  // Already waiting for a human: tell them what this worker knows (the effect did run).
  await ctx.db
    .updateTable('tool_receipt')
    .set({
      resolution: sql<string>`coalesce(resolution, '') || ${`; attempt ${attempt} later reported success (result digest ${digestOf(result)})`}`,
    })
    .where('receipt_id', '=', ref.receiptId)
    .where('status', '=', 'gated')
    .execute();
  const now = await ctx.load(ref.idempotencyKey, input.taskId);
  ctx.log.warn(
    { task_id: input.taskId, receipt_id: ref.receiptId, attempt, status: now?.status },
    'effect succeeded but the receipt had moved on; its record stands',
  );
  return settled(now ?? { receipt_id: ref.receiptId, idempotency_key: ref.idempotencyKey, status: 'gated' });
}

/** What a caller is told about a receipt another worker moved. */
export function settled<T>(
  row: Pick<ReceiptRow, 'receipt_id' | 'idempotency_key' | 'status'> & Partial<ReceiptRow>,
): RunOnceResult<T> {
  const ref = { receiptId: row.receipt_id, idempotencyKey: row.idempotency_key };
  switch (row.status) {
    case 'succeeded':
      return { ...ref, status: 'succeeded', result: row.result as T, ran: false };
    case 'compensated':
      return {
        ...ref,
        status: 'compensated',
        compensationReceiptId: row.resolution?.split(' ').pop() ?? '',
      };
    case 'failed':
      return { ...ref, status: 'failed', error: row.error ?? 'failed' };
    case 'gated':
      return { ...ref, status: 'gated' };
    default:
      return { ...ref, status: 'in_progress', worker: row.worker ?? '' };
  }
}

/**
 * Undoes an uncertain effect. Each step is a claimed transition (checked by its row count):
 * uncertain -> compensating (only one worker compensates), then the compensation under a
 * receipt of its own, then compensating -> compensated, or -> gated when the compensation
 * itself became uncertain. A receipt found compensating (its compensator died or is slow)
 * continues from its compensation's own receipt, which never runs twice.
 */
export async function compensateFrom<T>(
  ctx: ReceiptContext,
  input: RunOnceInput<T>,
  row: ReceiptRow,
  worker: string,
): Promise<RunOnceResult<T>> {
  const ref = { receiptId: row.receipt_id, idempotencyKey: row.idempotency_key };
  if (row.status === 'uncertain') {
    // Claimed under the caller's lease, in one transaction: a claim after the lease was lost
    // would stay compensating for good (the compensation is refused at its intent) (review).
    const claimed = await ctx.db.transaction().execute(async (trx) => {
      if (input.lease && !(await holdsFence(trx, input.lease))) {
        throw new LeaseLostError(
          `receipt ${row.receipt_id} of task ${input.taskId}: lease token ${input.lease.fencingToken} is no longer current; not compensated, left uncertain for the holder`,
        );
      }
      return trx
        .updateTable('tool_receipt')
        .set({ status: 'compensating', worker, resolution: `compensating (${worker})` })
        .where('receipt_id', '=', row.receipt_id)
        .where('status', '=', 'uncertain')
        .returning('receipt_id')
        .executeTakeFirst();
    });
    if (!claimed) return ctx.runOnce(input); // someone else moved it: look again
    await ctx.hooks.afterCompensationClaim?.();
    // The worker of the effect may have reported success meanwhile (the receipt is then
    // gated with that conflict): do not undo what a human now has to look at.
    const still = await ctx.load(row.idempotency_key, input.taskId);
    if (still?.status !== 'compensating') return settled(still ?? { ...row, status: 'gated' });
  }
  const compensation = await ctx
    .runOnce({
      taskId: input.taskId,
      step: `${input.step}/compensate`,
      tool: `${input.tool}.compensate`,
      args: { receipt_id: row.receipt_id },
      effect: (ctx) => input.compensate!({ ...ctx, idempotencyKey: row.idempotency_key }),
      onUncertain: 'gate',
      ...(input.lease ? { lease: input.lease } : {}),
      ...(input.gate ? { gate: input.gate } : {}),
    })
    .catch(async (err: unknown) => {
      // The lease was lost between the claim and the compensation's start (a compensator paused
      // past it): the compensation did not run. The claim goes back, so the holder finds the
      // receipt uncertain, not compensating for good under a worker that may not go on (review).
      // Only while no compensation receipt exists: one there (the new holder's, continuing this
      // claim; or this worker's own, cut off) may have run, and the claim is not ours to undo.
      if (err instanceof LeaseLostError) {
        await ctx.db
          .updateTable('tool_receipt')
          .set({ status: 'uncertain', resolution: `compensation not started: ${err.message}` })
          .where('receipt_id', '=', row.receipt_id)
          .where('status', '=', 'compensating')
          .where('worker', '=', worker)
          .where(({ not, exists, selectFrom }) =>
            not(
              exists(
                selectFrom('tool_receipt as c')
                  .select('c.receipt_id')
                  .where('c.task_id', '=', input.taskId)
                  .where('c.step', '=', `${input.step}/compensate`),
              ),
            ),
          )
          .execute();
      }
      throw err;
    });
  if (compensation.status === 'in_progress')
    return { ...ref, status: 'in_progress', worker: compensation.worker };
  const outcome =
    compensation.status === 'succeeded'
      ? {
          status: 'compensated' as const,
          resolution: `compensated by ${compensation.receiptId}`,
          finished_at: sql<Date>`now()`,
        }
      : compensation.status === 'failed'
        ? { status: 'uncertain' as const, resolution: `compensation failed: ${compensation.error}` }
        : {
            // The compensation itself became uncertain: only a human can tell what happened.
            status: 'gated' as const,
            resolution: `compensation ${compensation.receiptId} is uncertain; waiting for a human decision`,
          };
  const moved = await ctx.db
    .updateTable('tool_receipt')
    .set(outcome)
    .where('receipt_id', '=', row.receipt_id)
    .where('status', '=', 'compensating')
    .returning('receipt_id')
    .executeTakeFirst();
  if (!moved) {
    // The original worker reported success meanwhile: the receipt is gated with that conflict.
    const now = await ctx.load(row.idempotency_key, input.taskId);
    return settled(now ?? { ...row, status: 'gated' });
  }
  if (outcome.status === 'compensated') {
    return { ...ref, status: 'compensated', compensationReceiptId: compensation.receiptId };
  }
  if (outcome.status === 'uncertain') return compensation as RunOnceResult<T>;
  return { ...ref, status: 'gated' };
}
