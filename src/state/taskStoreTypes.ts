import { z } from 'zod';
import type { Checkpointer, TakeCheckpointInput } from '../checkpoints/checkpoints.js';
import type { Classification } from '../checkpoints/classification.js';
import type { TenantKeys } from '../crypto/tenantKeys.js';
import type { Db } from '../db/database.js';
import type { Trx } from '../db/executor.js';
import type { StaleWriteError } from '../errors.js';
import type { Fence } from '../leases/sql/fenceCheck.js';
import type { Logger } from '../logger.js';
import { objectWith, opt, optionsSchema } from '../options.js';
import type { OutboxMessageInput } from '../outbox/message.js';
import type { Outbox } from '../outbox/outbox.js';
import type { NewTask, TaskPatch } from '../schemas/taskPatch.js';
import { GATES, type GateName, type TaskState } from '../schemas/taskState.js';
import type { ChangelogOptions } from './changelog.js';
import { DEFAULT_REQUIRED_GATES } from './transitions.js';

/** The TaskStore's types and the schema its options are checked against (createTaskStore is in taskStore.ts). */

/** What createTaskStore takes. */
export interface TaskStoreOptions {
  db: Db;
  logger?: Logger;
  /** Gates that must be true before a task may be `complete` (default: plan, implementation, review). */
  requiredGates?: GateName[];
  /** Source of `updated_at` in documents; the audit row's `at` always comes from the database. */
  clock?: () => Date;
  /** How many recently seen documents to keep to save a read before a CAS (default 10 000). */
  cacheSize?: number;
  /** Where messages passed to update() go; a default outbox (no payload schemas) if omitted. */
  outbox?: Outbox;
  /** Takes checkpoints at semantic boundaries, in the transaction of the change. */
  checkpointer?: Checkpointer;
  /**
   * Tenant data keys: confidential artifacts are then stored encrypted in the task document
   * and its audit log, classified by `classification` (by default every artifact is
   * confidential).
   */
  keys?: TenantKeys;
  /** Field classes of the task document; without keys, a confidential artifact is refused. */
  classification?: Classification;
  /**
   * Also write every committed version to the changelog topic (src/state/changelog.ts), in
   * the transaction of the change, so a region that lost it can replay it.
   */
  changelog?: ChangelogOptions;
  /**
   * Send the updates made at the same time outside a transaction (no messages, lease,
   * checkpoint or changelog) as one statement per tenant (default true): each keeps its own
   * outcome, Postgres does one commit for them. False sends each in its own statement.
   */
  coalesceUpdates?: boolean;
}

export const StoreOptions = optionsSchema<TaskStoreOptions>()(
  z.strictObject({
    db: opt.db(),
    logger: opt.logger(),
    requiredGates: z.array(z.enum(GATES)).default([...DEFAULT_REQUIRED_GATES]),
    clock: opt.fn<() => Date>().default(() => () => new Date()),
    cacheSize: z.number().int().nonnegative().default(10_000),
    coalesceUpdates: z.boolean().default(true),
    outbox: objectWith<Outbox>('an Outbox (createOutbox())', 'enqueue', 'prepare', 'insert').optional(),
    checkpointer: objectWith<Checkpointer>('a Checkpointer (createCheckpointer())', 'take').optional(),
    keys: objectWith<TenantKeys>('TenantKeys (createTenantKeys())', 'seal', 'open').optional(),
    classification: z
      .custom<Classification>((v) => typeof v === 'object' && v !== null && !Array.isArray(v), {
        message: 'must be an object of field classes',
      })
      .optional(),
    changelog: z
      .strictObject({
        topic: z.string().min(1).optional(),
        keyRing: z
          .custom<NonNullable<ChangelogOptions['keyRing']>>(
            (v) => typeof v === 'object' && v !== null && 'current' in v && 'keys' in v,
            { message: 'must be a KeyRing ({ current, keys })' },
          )
          .optional(),
        keys: objectWith<TenantKeys>('TenantKeys (createTenantKeys())', 'seal', 'open').optional(),
      })
      .optional(),
  }),
);

/**
 * A compare-and-swap change to a task: the version it was made against, the patch, who
 * makes it and why, and what goes with it in the same transaction (messages, a checkpoint,
 * the lease it relies on).
 */
export interface UpdateInput {
  taskId: string;
  expectedVersion: number;
  patch: TaskPatch;
  /** SPIFFE ID of the agent or person making the change; becomes `updated_by`. */
  actor: string;
  reason?: string;
  /** Messages the change causes: enqueued in the same transaction, keyed by the task id by default. */
  messages?: readonly OutboxMessageInput[];
  /**
   * The lease this write relies on (a Lease from acquire, or any Fence): refused with
   * LeaseLostError unless its token is still current.
   */
  lease?: Fence;
  /**
   * Take a checkpoint with this change (same transaction). Taken anyway, with a reason of its
   * own, when the change crosses a boundary (gate passed, artifacts, task ended) and the
   * store has a checkpointer.
   */
  checkpoint?: Partial<Omit<TakeCheckpointInput, 'state'>> & { reason: string };
  /** Join the caller's transaction. */
  trx?: Trx;
}

export const UPDATE_KEYS = [
  'taskId',
  'expectedVersion',
  'patch',
  'actor',
  'reason',
  'messages',
  'lease',
  'checkpoint',
  'trx',
] as const satisfies readonly (keyof UpdateInput)[];

/**
 * The new state and the ids of the messages enqueued with it, or `reason: 'stale_version'`
 * when another write got there first (nothing was written).
 */
export type UpdateResult =
  | { ok: true; state: TaskState; messageIds: string[] }
  | {
      ok: false;
      reason: 'stale_version';
      expectedVersion: number;
      currentVersion: number | undefined;
      error: StaleWriteError;
    };

/**
 * One row of a task's audit log: the version it made, who made it and why, and the JSON
 * patch from the previous version.
 */
export interface AuditRow {
  task_id: string;
  version: number;
  prev_version: number | null;
  actor: string;
  reason: string | null;
  patch: unknown[];
  at: Date;
}

/**
 * Task documents under compare-and-swap, each change with its audit row and its messages in
 * one transaction.
 */
export interface TaskStore {
  /** Creates a task at version 1 (CairnError `already_exists` if it exists). */
  create(input: { task: NewTask; actor: string; reason?: string; trx?: Trx }): Promise<TaskState>;
  /** The current document of a task, if it exists. */
  get(taskId: string, opts?: { trx?: Trx }): Promise<TaskState | undefined>;
  /** Applies a change if the task is still at `expectedVersion`; see UpdateResult. */
  update(input: UpdateInput): Promise<UpdateResult>;
  /** The audit log of a task, oldest first. */
  history(taskId: string, opts?: { trx?: Trx }): Promise<AuditRow[]>;
}
