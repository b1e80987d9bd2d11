import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { sql } from 'kysely';
import { digestOf } from '../canonical.js';
import { mapSqlError } from '../db/sqlstate.js';
import type { ReceiptStatus } from '../db/types.js';
import { LeaseLostError, NotFoundError, ValidationError } from '../errors.js';
import type { Lease } from '../leases/leases.js';
import { holdsFence } from '../leases/sql/fenceCheck.js';
import { silentLogger } from '../logger.js';
import { parseOptions } from '../options.js';
import { parseStoredTaskState } from '../state/parseStored.js';
import { compensateFrom, lateSuccess, type ReceiptContext, settled } from './compensation.js';
import { gateUncertain } from './gate.js';
import { ReceiptStoreOptionsSchema } from './options.js';
import { outcomeUnknown } from './outcome.js';
import { reconcileTask } from './reconcile.js';
import { recordThroughOutages } from './record.js';
import { createResultCodec, NO_RESULT, type StoredRow } from './resultCodec.js';
import { COLUMNS, idempotencyKeyOf } from './rows.js';
import { receiptOwnerAlive } from './sql/ownerAlive.js';
import { reclaimReceipt } from './sql/reclaim.js';
import type {
  ReceiptRow,
  ReceiptStore,
  ReceiptStoreOptions,
  ReceiptTestHooks,
  Ref,
  RunOnceInput,
  RunOnceResult,
} from './types.js';

export { idempotencyKeyOf } from './rows.js';
export type {
  EffectContext,
  GateRecord,
  ReceiptRow,
  ReceiptStore,
  ReceiptStoreOptions,
  ReconcileAction,
  RunOnceInput,
  RunOnceResult,
  UncertainPolicy,
} from './types.js';

/** Makes a ReceiptStore. It holds no connection or timer of its own, so it has nothing to close. */
export function createReceiptStore(options: ReceiptStoreOptions): ReceiptStore {
  return createReceiptStoreWithTestHooks(options, {});
}

/** Internal: `createReceiptStore` with hooks at named points, for crash and interleaving tests. */
export function createReceiptStoreWithTestHooks(
  input: ReceiptStoreOptions,
  hooks: ReceiptTestHooks,
): ReceiptStore {
  const options = parseOptions('receipt store options', ReceiptStoreOptionsSchema, input);
  const { db } = options;
  const log = (options.logger ?? silentLogger).child({ component: 'receipts' });
  const abandonAfterMs = options.abandonAfterMs ?? 300_000;
  const { encodeSuccess, decode } = createResultCodec(db, options.keys, log);

  /**
   * The receipt of a key, for the task the key was made from (the key is a digest over the
   * task id): a row another tenant planted under the same key, on a task of its own, is not it.
   */
  async function load(key: string, taskId?: string): Promise<ReceiptRow | undefined> {
    let q = db.selectFrom('tool_receipt').select(COLUMNS).where('idempotency_key', '=', key);
    if (taskId !== undefined) q = q.where('task_id', '=', taskId);
    const row = (await q.orderBy('started_at').executeTakeFirst()) as StoredRow | undefined;
    return row && decode(row);
  }

  /** The intent row, committed before the effect runs. Returns the receipt id if this call created it. */
  async function insertIntent<T>(
    input: RunOnceInput<T>,
    key: string,
    worker: string,
  ): Promise<string | undefined> {
    return db
      .transaction()
      .execute(async (trx) => {
        if (input.lease && !(await holdsFence(trx, input.lease))) {
          throw new LeaseLostError(
            `receipt ${input.tool} at ${input.step} of task ${input.taskId}: lease token ${input.lease.fencingToken} is no longer current; the effect did not run`,
          );
        }
        const row = await trx
          .insertInto('tool_receipt')
          .values({
            receipt_id: randomUUID(),
            idempotency_key: key,
            task_id: input.taskId,
            step: input.step,
            tool: input.tool,
            args_digest: digestOf(input.args),
            status: 'started',
            irreversible: input.irreversible ?? false,
            worker,
            lease_task_id: input.lease?.taskId ?? null,
            lease_branch: input.lease?.branch ?? null,
            lease_id: input.lease?.leaseId ?? null,
            fencing_token: input.lease?.fencingToken ?? null,
          })
          // Unique per tenant and key: a second intent for the same key is "not new".
          .onConflict((oc) => oc.doNothing())
          .returning('receipt_id')
          .executeTakeFirst();
        if (row && input.irreversible && options.checkpointer) {
          const task = await trx
            .selectFrom('task_state')
            .select(['task_id', 'tenant_id', 'version', 'doc'])
            .where('task_id', '=', input.taskId)
            .executeTakeFirst();
          if (task) {
            await options.checkpointer.take(trx, {
              state: parseStoredTaskState(task),
              reason: `before irreversible effect: ${input.tool} at ${input.step} (receipt ${row.receipt_id})`,
              createdBy: worker,
            });
          }
        }
        return row?.receipt_id;
      })
      .catch((err: unknown) => {
        throw mapSqlError(err); // a quarantined task (CN009): no new effect starts
      });
  }

  const record = <R>(what: string, write: () => Promise<R>) => recordThroughOutages(log, what, write);

  /** Runs the effect for an intent this worker holds, and records how it ended. */
  async function execute<T>(input: RunOnceInput<T>, ref: Ref, attempt: number): Promise<RunOnceResult<T>> {
    await hooks.afterIntent?.();
    // A worker slow between its intent and its effect (paused past its lease) must not start
    // the effect once another holds the task: it looks at its fence again, and if it is gone
    // the effect did not run, which the receipt can say for certain (unless the new holder
    // already took it over). Between this check and the effect the window stays; a late
    // success is then handled by lateSuccess.
    if (input.lease && !(await holdsFence(db, input.lease))) {
      await record('that the effect did not run', () =>
        db
          .updateTable('tool_receipt')
          .set({
            status: 'failed',
            error: 'lease lost before the effect: it did not run',
            finished_at: sql<Date>`now()`,
          })
          .where('receipt_id', '=', ref.receiptId)
          .where('status', '=', 'started')
          .where('attempt', '=', attempt)
          .execute(),
      );
      throw new LeaseLostError(
        `receipt ${input.tool} at ${input.step} of task ${input.taskId}: lease token ${input.lease.fencingToken} was lost after the intent; the effect did not run`,
      );
    }
    let result: T;
    try {
      result = await input.effect({ ...ref, attempt });
    } catch (err) {
      // Kept to 64 Ki characters: the receipt's error is bounded (migration 0017), and an
      // effect's message of any length must not keep its outcome from being recorded.
      const full = (err as Error)?.message ?? String(err);
      const message = full.length > 65536 ? `${full.slice(0, 65536)}… (truncated)` : full;
      // A call cut off after its request left (a reset, a timeout) may have done its work: the
      // outcome is unknown, and an unknown outcome is compensated or gated, never run again
      // blindly. A tool declared idempotent may run again: the external API dedupes by the key.
      const unknown = outcomeUnknown(err) && input.onUncertain !== 'retry';
      await record('how the effect ended', () =>
        db
          .updateTable('tool_receipt')
          .set({ status: unknown ? 'uncertain' : 'failed', error: message, finished_at: sql<Date>`now()` })
          .where('receipt_id', '=', ref.receiptId)
          .where('status', '=', 'started')
          .where('attempt', '=', attempt)
          .execute(),
      );
      log.warn(
        { task_id: input.taskId, receipt_id: ref.receiptId, err: message },
        unknown ? 'effect cut off: its outcome is unknown' : 'effect failed',
      );
      if (!unknown) return { ...ref, status: 'failed', error: message };
      // Settling it (gate, compensate) is the lease holder's: a worker that lost its lease
      // leaves the receipt uncertain for the holder (a gate without its audit row, or a
      // compensation refused at its intent and stuck compensating, otherwise).
      if (input.lease && !(await holdsFence(db, input.lease))) {
        throw new LeaseLostError(
          `receipt ${input.tool} at ${input.step} of task ${input.taskId}: the effect was cut off (${message}) and lease token ${input.lease.fencingToken} is no longer current: left uncertain for the holder`,
        );
      }
      const row = await load(ref.idempotencyKey, input.taskId);
      if (row?.status !== 'uncertain') return store.runOnce(input); // someone else moved it: look again
      return resolveUncertain(input, row, options.worker ?? `${hostname()}:${process.pid}`);
    }
    await hooks.afterEffect?.();
    // Recording a success is never fenced: the effect happened, and saying so is always
    // right, unless someone already acted on the belief that it might not have (below).
    const recorded = await record('the success', async () =>
      db
        .updateTable('tool_receipt')
        .set({
          status: 'succeeded',
          ...(input.digestOnly ? NO_RESULT : await encodeSuccess(ref.receiptId, result)),
          result_digest: digestOf(result),
          finished_at: sql<Date>`now()`,
        })
        .where('receipt_id', '=', ref.receiptId)
        .where('attempt', '=', attempt)
        .where('status', 'in', ['started', 'uncertain'])
        .returning('receipt_id')
        .executeTakeFirst(),
    );
    if (recorded) return { ...ref, status: 'succeeded', result, ran: true };
    // The first try committed and only its answer was lost (record() sent it again): this is
    // still this call's success, not someone else's.
    const now = await load(ref.idempotencyKey, input.taskId);
    if (now?.status === 'succeeded' && now.attempt === attempt && now.result_digest === digestOf(result))
      return { ...ref, status: 'succeeded', result, ran: true };
    return lateSuccess(ctx, input, ref, attempt, result);
  }

  const reclaim = (receiptId: string, from: ReceiptStatus, worker: string, lease?: Lease) =>
    // With a lease, the take-over and the fence check are one transaction: a worker whose
    // lease lapsed must not take a receipt back (the new holder would then find it started by
    // a dead lease, call it uncertain and gate or compensate an effect that never ran).
    db.transaction().execute(async (trx) => {
      if (lease && !(await holdsFence(trx, lease))) {
        throw new LeaseLostError(
          `receipt ${receiptId}: lease token ${lease.fencingToken} is no longer current; it was not taken over and no effect ran`,
        );
      }
      return reclaimReceipt(trx, { receiptId, from, worker, ...(lease ? { lease } : {}) });
    });
  const ownerAlive = (receiptId: string) => receiptOwnerAlive(db, receiptId, abandonAfterMs);

  const compensationTried = async (input: { taskId: string; step: string }) =>
    (await db
      .selectFrom('tool_receipt')
      .select('receipt_id')
      .where('task_id', '=', input.taskId)
      .where('step', '=', `${input.step}/compensate`)
      .executeTakeFirst()) !== undefined;

  async function resolveUncertain<T>(
    input: RunOnceInput<T>,
    row: ReceiptRow,
    worker: string,
  ): Promise<RunOnceResult<T>> {
    const ref = { receiptId: row.receipt_id, idempotencyKey: row.idempotency_key };
    log.warn(
      { task_id: input.taskId, receipt_id: row.receipt_id, policy: input.onUncertain },
      'uncertain receipt',
    );
    // Not once a compensation of it was tried: the effect was meant to be undone, a human decides.
    if (input.onUncertain === 'retry' && !(await compensationTried(input))) {
      const attempt = await reclaim(row.receipt_id, 'uncertain', worker, input.lease);
      if (attempt === undefined) return store.runOnce(input); // someone else moved it: look again
      return execute(input, ref, attempt);
    }
    if (input.onUncertain === 'compensate') return compensateFrom(ctx, input, row, worker);
    // gate: wait for a human. The receipt says so, and so does the task's audit log.
    if (!(await gateUncertain(db, input, row))) return store.runOnce(input); // someone else moved it: look again
    return { ...ref, status: 'gated' };
  }

  const ctx: ReceiptContext = {
    db,
    log,
    hooks,
    load,
    runOnce: (input) => store.runOnce(input),
  };

  const store: ReceiptStore = {
    async runOnce<T>(input: RunOnceInput<T>): Promise<RunOnceResult<T>> {
      if (input.onUncertain === 'retry' && !input.idempotentTool) {
        throw new ValidationError('runOnce', [
          {
            path: 'onUncertain',
            message: `"retry" is only for tools declared idempotent (idempotentTool: true); ${input.tool} is not`,
            value: 'retry',
          },
        ]);
      }
      if (input.onUncertain === 'compensate' && !input.compensate) {
        throw new ValidationError('runOnce', [
          { path: 'compensate', message: 'is required when onUncertain is "compensate"' },
        ]);
      }
      const key = idempotencyKeyOf(input);
      const worker = options.worker ?? input.lease?.agentId ?? `${hostname()}:${process.pid}`;
      for (let round = 0; round < 5; round++) {
        const created = await insertIntent(input, key, worker);
        if (created) return execute(input, { receiptId: created, idempotencyKey: key }, 1);
        const row = await load(key, input.taskId);
        if (!row) continue; // deleted between insert and read (retention): try again
        const ref = { receiptId: row.receipt_id, idempotencyKey: key };
        switch (row.status) {
          case 'succeeded':
          case 'compensated':
          case 'gated':
            return settled(row);
          case 'failed': {
            // The effect said it did not happen: trying again is safe.
            const attempt = await reclaim(row.receipt_id, 'failed', worker, input.lease);
            if (attempt !== undefined) return execute(input, ref, attempt);
            continue;
          }
          case 'started': {
            if (await ownerAlive(row.receipt_id))
              return { ...ref, status: 'in_progress', worker: row.worker };
            await db
              .updateTable('tool_receipt')
              .set({ status: 'uncertain', finished_at: sql<Date>`now()` })
              .where('receipt_id', '=', row.receipt_id)
              .where('status', '=', 'started')
              .where('attempt', '=', row.attempt)
              .execute();
            continue;
          }
          case 'uncertain':
            return resolveUncertain(input, row, worker);
          case 'compensating':
            return input.onUncertain === 'compensate'
              ? compensateFrom(ctx, input, row, worker)
              : { ...ref, status: 'in_progress', worker: row.worker };
        }
      }
      throw new NotFoundError('settled receipt after 5 rounds for key', key);
    },

    byKey: (key, taskId) => load(key, taskId),

    reconcile: (taskId, opts) =>
      reconcileTask(
        {
          db,
          byTask: (id) => store.byTask(id),
          ownerAlive: async (id) => {
            const alive = await ownerAlive(id);
            if (!alive) await hooks.afterOwnerGone?.(id);
            return alive;
          },
          resolveUncertain,
          worker: options.worker ?? `${hostname()}:${process.pid}`,
        },
        taskId,
        opts,
      ),

    async byTask(taskId) {
      const rows = (await db
        .selectFrom('tool_receipt')
        .select(COLUMNS)
        .where('task_id', '=', taskId)
        .orderBy('started_at')
        .execute()) as StoredRow[];
      return Promise.all(rows.map(decode));
    },

    async resolveGate(receiptId, decision) {
      const r = await db
        .updateTable('tool_receipt')
        .set({
          status: decision.outcome,
          resolution: `${decision.actor}: ${decision.reason}`,
          finished_at: sql<Date>`now()`,
        })
        .where('receipt_id', '=', receiptId)
        .where('status', '=', 'gated')
        .returning('receipt_id')
        .executeTakeFirst();
      if (!r) throw new NotFoundError('gated receipt', receiptId);
    },
  };
  return store;
}
