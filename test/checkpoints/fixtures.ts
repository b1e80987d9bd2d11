import { workflowDigestOf } from '../../src/recovery/resume.js';
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
