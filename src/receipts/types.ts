import type { Checkpointer } from '../checkpoints/checkpoints.js';
import type { TenantKeys } from '../crypto/tenantKeys.js';
import type { Db } from '../db/database.js';
import type { ReceiptStatus } from '../db/types.js';
import type { Lease } from '../leases/leases.js';
import type { Fence } from '../leases/sql/fenceCheck.js';
import type { Logger } from '../logger.js';
import type { TaskStore } from '../state/taskStore.js';

/**
 * What to do with a receipt a dead worker left `started`: compensate the effect, gate it
 * for a human, or retry it (idempotent tools only).
 */
export type UncertainPolicy = 'compensate' | 'gate' | 'retry';

/**
 * What an effect is handed: the idempotency key to pass to the external API, its receipt
 * and attempt.
 */
export interface EffectContext {
  /** Deterministic for (task, step, tool, canonical args): pass it to the external API as its idempotency key. */
  idempotencyKey: string;
  receiptId: string;
  attempt: number;
}

/**
 * A side effect to run once per (task, step, tool, args), and what to do when an earlier
 * attempt's outcome is unknown.
 */
export interface RunOnceInput<T> {
  taskId: string;
  step: string;
  tool: string;
  args: unknown;
  /** The side effect; it gets the idempotency key to pass on. */
  effect: (ctx: EffectContext) => Promise<T>;
  /** What to do with a receipt left `started` by a worker that died: never a blind retry. */
  onUncertain: UncertainPolicy;
  /** `retry` is allowed only for tools declared idempotent (the external API dedupes by the key). */
  idempotentTool?: boolean;
  irreversible?: boolean;
  /** Undoes the effect; runs under a receipt of its own. Required for `compensate`. */
  compensate?: (ctx: EffectContext) => Promise<unknown>;
  /** The lease the work runs under: the intent is refused (LeaseLostError) unless it is current. */
  lease?: Lease;
  /** For `gate`: record the wait for a human in TaskState and its audit log. */
  gate?: GateRecord;
  /** Keep only a sha256 digest of the result, not the result itself. */
  digestOnly?: boolean;
}

/** Where a gate is recorded: the task's audit log, under the caller's lease when it has one. */
export interface GateRecord {
  store: TaskStore;
  actor: string;
  /** The lease the caller holds: the audit write is refused unless it is still current. */
  lease?: Fence;
}

/** Which receipt a result is about: its id and its idempotency key. */
export interface Ref {
  receiptId: string;
  idempotencyKey: string;
}

/**
 * How runOnce ended: succeeded (`ran` false when an earlier call did it), failed, in
 * progress under another worker, compensated, or gated for a human.
 */
export type RunOnceResult<T> =
  | (Ref & { status: 'succeeded'; result: T; ran: boolean })
  | (Ref & { status: 'failed'; error: string })
  | (Ref & { status: 'in_progress'; worker: string })
  | (Ref & { status: 'compensated'; compensationReceiptId: string })
  | (Ref & { status: 'gated' });

/**
 * A tool receipt as stored: one per idempotency key, with its status, attempt, worker and
 * outcome.
 */
export interface ReceiptRow {
  receipt_id: string;
  idempotency_key: string;
  task_id: string;
  step: string;
  tool: string;
  status: ReceiptStatus;
  attempt: number;
  worker: string;
  result: unknown;
  result_digest: string | null;
  error: string | null;
  resolution: string | null;
  started_at: Date;
  finished_at: Date | null;
}

/**
 * Runs side effects at most once per idempotency key, with a receipt committed before the
 * effect and its outcome after.
 */
export interface ReceiptStore {
  /**
   * Runs the effect unless a receipt for its key says it ran, runs or may have run; see
   * RunOnceResult.
   */
  runOnce<T>(input: RunOnceInput<T>): Promise<RunOnceResult<T>>;
  /**
   * The receipt of an idempotency key, if any; of that task's, when `taskId` is given. Without
   * it, a store on a role that sees every tenant (the owner) may find another tenant's row
   * under the same key: give the task whenever the answer decides anything.
   */
  byKey(idempotencyKey: string, taskId?: string): Promise<ReceiptRow | undefined>;
  /** Every receipt of a task, oldest first. */
  byTask(taskId: string): Promise<ReceiptRow[]>;
  /**
   * For resume: settles every receipt of a task. Succeeded ones are skipped; ones left started
   * by a dead worker (or uncertain) are compensated when a compensator for their tool is
   * given, left uncertain for their worker to retry when the tool is in `idempotentTools`, else
   * gated; a running one is reported in progress.
   */
  reconcile(
    taskId: string,
    opts: {
      compensators?: Record<string, (ctx: EffectContext) => Promise<unknown>>;
      /**
       * Tools whose own API applies an idempotency key once (the ones a worker's runOnce declares
       * `idempotentTool` with `onUncertain: 'retry'`): an uncertain receipt of one is left
       * uncertain (action `retry`), and the worker's next runOnce runs it again with the same key.
       * A compensator for the same tool comes first.
       */
      idempotentTools?: readonly string[];
      gate?: GateRecord;
      /**
       * The task's lease the caller holds (resume passes it through `gate.lease`): nothing is
       * settled, compensated or gated once it is lost. Without one, nothing is fenced.
       */
      lease?: Lease;
    },
  ): Promise<Array<{ receiptId: string; tool: string; step: string; action: ReconcileAction }>>;
  /** A human's decision on a gated receipt: what really happened outside. */
  resolveGate(
    receiptId: string,
    decision: { outcome: 'succeeded' | 'failed' | 'compensated'; actor: string; reason: string },
  ): Promise<void>;
}

/**
 * What reconcile did with a receipt: skipped (succeeded), may run (failed), in progress,
 * compensated, gated, or already settled.
 */
export type ReconcileAction =
  | 'skip'
  | 'may_run'
  | 'in_progress'
  | 'compensated'
  | 'gated'
  | 'settled'
  /** Left uncertain: an idempotent tool's worker runs it again with the same key. */
  | 'retry';

/** What createReceiptStore takes. */
export interface ReceiptStoreOptions {
  db: Db;
  logger?: Logger;
  /** Identity written on receipts; defaults to the lease's agent, else host:pid. */
  worker?: string;
  /** Without a lease, a `started` receipt older than this (database clock) counts as abandoned. */
  abandonAfterMs?: number;
  /** Takes a checkpoint in the same transaction as the intent of an irreversible effect. */
  checkpointer?: Checkpointer;
  /** Tenant data keys: results are then stored encrypted (AES-256-GCM), the key id beside them. */
  keys?: TenantKeys;
}

/**
 * Named points where a crash or interleaving test kills or pauses a worker. Internal: no
 * entry point exports it; tests reach it through `createReceiptStoreWithTestHooks`.
 */
export interface ReceiptTestHooks {
  /** After the intent row committed, before the effect runs. */
  afterIntent?(): void | Promise<void>;
  /** After the effect returned, before its success is recorded. */
  afterEffect?(): void | Promise<void>;
  /** After a receipt was claimed for compensation, before the compensation runs. */
  afterCompensationClaim?(): void | Promise<void>;
  /** reconcile: a started receipt's owner was found gone, before the receipt is marked uncertain. */
  afterOwnerGone?(receiptId: string): void | Promise<void>;
}
