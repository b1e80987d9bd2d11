import { sql } from 'kysely';
import { z } from 'zod';
import { canonicalBytes, sha256 } from '../canonical.js';
import type { Checkpointer, StoredCheckpoint } from '../checkpoints/checkpoints.js';
import type { Db } from '../db/database.js';
import {
  CairnError,
  CairnErrorCodes,
  LeaseHeldError,
  NotFoundError,
  UnavailableError,
  ValidationError,
} from '../errors.js';
import type { Lease, LeaseManager } from '../leases/leases.js';
import { objectWith, opt, optionsSchema, parseOptions } from '../options.js';
import type { EffectContext, ReceiptStore, ReconcileAction } from '../receipts/receipts.js';
import type { TaskState } from '../schemas/taskState.js';
import { zodIssues } from '../schemas/zodIssues.js';
import type { TaskStore } from '../state/taskStore.js';
import { isTerminal } from '../state/transitions.js';
import { activeHold } from './quarantine.js';

/** What the current policy says, read fresh at every resume: never taken from a checkpoint. */
export const Policy = z.strictObject({
  version: z.string().min(1),
  /** A JSON boolean: the string "false" is refused, never read as true. */
  allowed: z.boolean(),
  /** The most this task may have committed, in USD. */
  budgetLimitUsd: z.number().finite().nonnegative(),
});
export type Policy = z.infer<typeof Policy>;

/** Validates a policy (from a file, a service, a caller) naming the bad field. */
export function parsePolicy(input: unknown, what = 'resume policy'): Policy {
  const r = Policy.safeParse(input);
  if (!r.success) throw new ValidationError(what, zodIssues(r.error, input));
  return r.data;
}

/**
 * What resume needs: the stores it reads and writes, the workflow definition and policy to
 * check against, and who is resuming.
 */
export interface ResumeOptions {
  db: Db;
  store: TaskStore;
  checkpoints: Checkpointer;
  receipts: ReceiptStore;
  leases: LeaseManager;
  /** The workflow definition the resuming agent runs; its canonical sha256 must match the checkpoint's. */
  workflowDefinition: unknown;
  /** Other digests declared compatible with this definition (for example after a cosmetic change). */
  compatibleDigests?: readonly string[];
  /**
   * Reads the current policy (from a file, a service): called once per resume, never taken
   * from the checkpoint.
   */
  policy: () => Promise<Policy>;
  /** SPIFFE ID written on the audit rows resume causes. */
  actor: string;
  agentId: string;
  /** Time to live of the task lease resume takes, in milliseconds (default 30 000). */
  leaseTtlMs?: number;
  branch?: string;
  /**
   * Compensations per tool name, for receipts a dead worker left uncertain; without one the
   * receipt is gated.
   */
  compensators?: Record<string, (ctx: EffectContext) => Promise<unknown>>;
  /**
   * Tools whose own API applies an idempotency key once: a receipt of one that a dead worker
   * left uncertain is not gated but left for the task's worker to run again with the same key
   * (its runOnce declares `idempotentTool` and `onUncertain: 'retry'`).
   */
  idempotentTools?: readonly string[];
}

/**
 * What resume did: the checkpoint it resumed from (and the newer ones it skipped, with
 * why), the budget, how each receipt was settled, where the pending messages are, and the
 * lease it now holds.
 */
export interface ResumePlan {
  taskId: string;
  outcome: 'resumed' | 'failed' | 'terminal';
  checkpointId?: string;
  /** Newer checkpoints that failed verification, with why; each was written to the audit log. */
  skipped: Array<{ checkpointId: string; reason: string }>;
  policyVersion?: string;
  budget?: { committedBefore: number; committedAfter: number; limit: number };
  receipts: Array<{ receiptId: string; tool: string; step: string; action: ReconcileAction }>;
  pendingMessages: Array<{ messageId: string; state: 'queued' | 'published' }>;
  lease?: Lease;
  state: TaskState;
}

/** The sha256 of a workflow definition's canonical JSON, as checkpoints record it. */
export function workflowDigestOf(definition: unknown): string {
  return sha256(canonicalBytes(definition));
}

const ResumeOptionsSchema = optionsSchema<ResumeOptions>()(
  z.strictObject({
    db: opt.db(),
    store: objectWith<TaskStore>('a TaskStore (createTaskStore())', 'get', 'update'),
    checkpoints: objectWith<Checkpointer>('a Checkpointer (createCheckpointer())', 'list', 'verify'),
    receipts: objectWith<ReceiptStore>('a ReceiptStore (createReceiptStore())', 'reconcile'),
    leases: objectWith<LeaseManager>('a LeaseManager (createLeaseManager())', 'acquire', 'release'),
    workflowDefinition: z.unknown().refine((v) => v !== undefined, 'is required'),
    compatibleDigests: z.array(opt.text()).readonly().optional(),
    policy: opt.fn<() => Promise<Policy>>('an async function returning the current Policy'),
    actor: opt.text(),
    agentId: opt.text(),
    leaseTtlMs: opt.ms().optional(),
    branch: opt.text().optional(),
    compensators: z.record(z.string(), opt.fn<(ctx: EffectContext) => Promise<unknown>>()).optional(),
    idempotentTools: z.array(opt.text()).readonly().optional(),
  }),
);

/**
 * Resumes a task after its worker died: take the task's lease first (nothing is written to
 * the task before, and every write after carries it as a fence, so a live or slow worker's
 * task is never changed under it), verify the newest checkpoint (falling back to older ones,
 * audited), check the workflow definition, re-authorize against the current policy and
 * re-reserve budget under it, settle side effects from receipts, and report where the
 * pending messages are. A checkpoint that cannot be read because a key or its provider is
 * unavailable stops the resume (UnavailableError, lease released, nothing written): an outage
 * is never taken for corruption. On any error the lease is released.
 */
export async function resume(taskId: string, options: ResumeOptions): Promise<ResumePlan> {
  const o = parseOptions('resume options', ResumeOptionsSchema, options);
  const first = await o.store.get(taskId);
  if (!first) throw new NotFoundError('task', taskId);
  if (isTerminal(first.status)) {
    return { taskId, outcome: 'terminal', skipped: [], receipts: [], pendingMessages: [], state: first };
  }
  const got = await o.leases.acquire({
    taskId,
    branch: o.branch ?? 'main',
    agentId: o.agentId,
    ttlMs: o.leaseTtlMs ?? 30_000,
  });
  if (!got.ok)
    throw new LeaseHeldError(got.holder, got.expiresAt, `task ${taskId} (a live worker still runs it)`);
  const { ok: _ok, ...lease } = got;
  try {
    return await resumeHolding(taskId, o, lease);
  } catch (err) {
    await o.leases.release(lease).catch(() => {});
    throw err;
  }
}

async function resumeHolding(taskId: string, o: ResumeOptions, lease: Lease): Promise<ResumePlan> {
  // Read again under the lease: the worker that held it may have written until it let go.
  let state = (await o.store.get(taskId))!;
  if (isTerminal(state.status)) {
    await o.leases.release(lease);
    return { taskId, outcome: 'terminal', skipped: [], receipts: [], pendingMessages: [], state };
  }
  // A task held after a failover stays as it was held: not even its receipts are settled.
  const held = await activeHold(o.db, taskId);
  if (held) {
    throw new CairnError(
      CairnErrorCodes.Quarantined,
      `task ${taskId} is held since ${held.placed_at.toISOString()} (${held.reason}): resume wrote nothing; ` +
        'release it first (cairn failover release)',
    );
  }

  // Read (and validate) the current policy before anything is written.
  const policy = parsePolicy(await o.policy());

  // 1. The newest checkpoint that verifies.
  const all = await o.checkpoints.list(taskId);
  const skipped: ResumePlan['skipped'] = [];
  let chosen: StoredCheckpoint | undefined;
  for (let i = 0; i < all.length; i++) {
    const v = await o.checkpoints.verify(all[i]!, all[i + 1]);
    if (v.ok) {
      chosen = all[i];
      break;
    }
    if (v.reason === 'unavailable') {
      throw new UnavailableError(
        `task ${taskId}: checkpoint ${all[i]!.checkpoint.checkpoint_id} cannot be checked now (${v.message}); ` +
          'resume stopped and wrote nothing: restore the key or its provider and run it again ' +
          '(a tenant that was crypto-shredded can never be read again: cancel its tasks instead)',
      );
    }
    skipped.push({ checkpointId: all[i]!.checkpoint.checkpoint_id, reason: v.message });
  }
  const audit = async (patch: object, reason: string) => {
    const r = await o.store.update({
      taskId,
      expectedVersion: state.version,
      patch,
      actor: o.actor,
      reason,
      lease,
    });
    if (!r.ok) throw r.error;
    state = r.state;
  };
  for (const s of skipped) {
    await audit({}, `resume: checkpoint ${s.checkpointId} failed verification (${s.reason}); falling back`);
  }
  if (!chosen) {
    await audit(
      { status: 'failed' },
      `resume: no valid checkpoint (${all.length === 0 ? 'none taken' : `${all.length} failed verification`}); task failed`,
    );
    await o.leases.release(lease);
    return { taskId, outcome: 'failed', skipped, receipts: [], pendingMessages: [], state };
  }
  const cp = chosen.checkpoint;

  // 2. The workflow must be the one the checkpoint was taken under.
  const current = workflowDigestOf(o.workflowDefinition);
  if (
    cp.workflow_definition_digest &&
    cp.workflow_definition_digest !== current &&
    !o.compatibleDigests?.includes(cp.workflow_definition_digest)
  ) {
    throw new CairnError(
      'workflow_mismatch',
      `task ${taskId}: checkpoint ${cp.checkpoint_id} was taken under workflow ${cp.workflow_definition_digest}, ` +
        `the current definition is ${current}; declare it compatible or resume with the matching definition`,
    );
  }

  // 3. Re-authorize: current policy, budget re-reserved under its limit (never restored from the checkpoint).
  if (!policy.allowed) {
    throw new CairnError(
      'not_authorized',
      `task ${taskId}: policy ${policy.version} does not allow resuming it`,
    );
  }
  const committedBefore = state.budget.currency_committed_usd;
  const committedAfter = Math.max(
    state.budget.currency_spent_usd,
    Math.min(committedBefore, policy.budgetLimitUsd),
  );
  if (committedAfter !== committedBefore) {
    await audit(
      { budget: { currency_committed_usd: committedAfter } },
      `resume: budget re-reserved under policy ${policy.version} (limit ${policy.budgetLimitUsd} USD)`,
    );
  }

  // 4. Side effects, from receipts (a gate is written to the audit log under the lease).
  const receipts = await o.receipts.reconcile(taskId, {
    ...(o.compensators ? { compensators: o.compensators } : {}),
    ...(o.idempotentTools ? { idempotentTools: o.idempotentTools } : {}),
    gate: { store: o.store, actor: o.actor, lease },
  });
  state = (await o.store.get(taskId))!;

  // 5. Where the pending messages are (same ids: inboxes drop any already applied).
  const wanted = cp.pending_work.flatMap((p) => (p.message_id ? [p.message_id] : []));
  const queued = new Set(
    wanted.length === 0
      ? []
      : (
          await o.db
            .selectFrom('outbox')
            .select('message_id')
            .where('message_id', 'in', wanted)
            // Ids are unique per tenant: another tenant's row under the same id is not this one
            // (review). An untagged row is the owner's, and the checkpoint's pending work counts it.
            .where(sql<boolean>`(coalesce(tenant_id, '') = ${state.tenant_id ?? ''} OR tenant_id IS NULL)`)
            .execute()
        ).map((r) => r.message_id),
  );
  return {
    taskId,
    outcome: 'resumed',
    checkpointId: cp.checkpoint_id,
    skipped,
    policyVersion: policy.version,
    budget: { committedBefore, committedAfter, limit: policy.budgetLimitUsd },
    receipts,
    pendingMessages: wanted.map((id) => ({ messageId: id, state: queued.has(id) ? 'queued' : 'published' })),
    lease,
    state,
  };
}
