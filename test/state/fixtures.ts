import type { NewTask, TaskPatch } from '../../src/schemas/taskPatch.js';

export const AGENT = 'spiffe://acme.example/agents/planner';
export const DIGEST = `sha256:${'ab'.repeat(32)}`;

export function newTask(taskId: string, extra: Partial<NewTask> = {}): NewTask {
  return {
    tenant_id: 'acme',
    task_id: taskId,
    workflow_digest: DIGEST,
    intent_id: `intent-${taskId}`,
    budget: { currency_committed_usd: 100, currency_spent_usd: 0, tokens_spent: 0, hops_used: 0 },
    ...extra,
  };
}

/** The planner's step: planning -> implementing, its gate passed and its plan recorded (a checkpoint boundary). */
export function planApproved(plan = 's3://plans/1'): TaskPatch {
  return { status: 'implementing', gates: { plan_approved: true }, artifacts: { implementation_plan: plan } };
}
