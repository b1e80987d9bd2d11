import type { Checkpointer } from '../../src/checkpoints/checkpoints.js';
import type { Db } from '../../src/db/database.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { type ResumeOptions, workflowDigestOf } from '../../src/recovery/resume.js';
import type { TaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';

/** The workflow definition the resume tests' tasks run under. */
export const WORKFLOW = { name: 'ship-feature', steps: ['plan', 'implement', 'review', 'test', 'deploy'] };

/**
 * A task under WORKFLOW moved to implementing with its plan approved: with a checkpointer,
 * two checkpoints (created, plan approved).
 */
export async function seedPlannedTask(store: TaskStore, taskId: string, tenantId?: string): Promise<void> {
  await store.create({
    task: newTask(taskId, {
      workflow_digest: workflowDigestOf(WORKFLOW),
      ...(tenantId ? { tenant_id: tenantId } : {}),
    }),
    actor: AGENT,
  });
  const r = await store.update({
    taskId,
    expectedVersion: 1,
    patch: { status: 'implementing', gates: { plan_approved: true } },
    actor: AGENT,
  });
  if (!r.ok) throw r.error;
}

/**
 * Options for resume() over one database, with a policy that allows it (limit 1,000 USD) and
 * a fresh receipt store and lease manager; `extra` overrides any of them.
 */
export function resumeOptions(
  parts: { db: Db; store: TaskStore; checkpoints: Checkpointer },
  extra: Partial<ResumeOptions> = {},
): ResumeOptions {
  return {
    ...parts,
    receipts: createReceiptStore({ db: parts.db }),
    leases: createLeaseManager({ db: parts.db }),
    workflowDefinition: WORKFLOW,
    policy: async () => ({ version: 'policy-1', allowed: true, budgetLimitUsd: 1000 }),
    actor: 'spiffe://acme.example/cairn/recovery',
    agentId: 'resumer',
    ...extra,
  };
}
