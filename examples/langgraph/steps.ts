import type { Fence, GateName, TaskPatch, TaskStatus, TaskStore } from '../../src/index.js';
import type { Agent } from './killPoints.js';

/** What each node does to the task: the status it moves it to, the gates it passes, what it leaves behind. */
export const STEPS: Record<
  Agent,
  {
    from: TaskStatus;
    to: TaskStatus;
    gates: Partial<Record<GateName, boolean>>;
    artifacts: (taskId: string) => TaskPatch['artifacts'];
  }
> = {
  planner: {
    from: 'planning',
    to: 'implementing',
    gates: { plan_approved: true },
    artifacts: (id) => ({ implementation_plan: `s3://example/plans/${id}.md` }),
  },
  coder: {
    from: 'implementing',
    to: 'reviewing',
    gates: { implementation_complete: true },
    artifacts: (id) => ({ code_files: [`src/${id}/healthz.ts`, `src/${id}/healthz.test.ts`] }),
  },
  reviewer: {
    from: 'reviewing',
    to: 'testing',
    gates: { review_passed: true, security_approved: true },
    artifacts: (id) => ({ review_report: `s3://example/reviews/${id}.md` }),
  },
  tester: {
    from: 'testing',
    to: 'testing',
    gates: { tests_passing: true, deployment_approved: true },
    artifacts: (id) => ({ test_results: `s3://example/tests/${id}.xml` }),
  },
  deploy: { from: 'testing', to: 'complete', gates: {}, artifacts: () => ({}) },
};

export const actorOf = (agent: Agent) => `spiffe://example.cairn.local/agents/${agent}`;

/** What a node commits: the task at the version the graph last saw, and the node's short answer. */
export interface StepInput {
  store: TaskStore;
  topic: string;
  agent: Agent;
  taskId: string;
  /** The task version in the graph's state: the CAS expects exactly this one. */
  expectedVersion: number;
  /** The model's answer (never its reasoning): goes into the outbox message. */
  summary: string;
  /** The deploy's lease: the write is refused if it lapsed. */
  lease?: Fence;
}

/**
 * The node's change to TaskState, its audit row and its outbox message, in one transaction
 * under compare-and-swap. Returns the task's new version.
 *
 * A process killed after this commit and before LangGraph recorded the node runs the node
 * again on resume; its CAS then finds the task one version ahead. When the audit row of that
 * version is this agent's, with this step's reason, it is the dead run's own commit: adopted,
 * not repeated. Anything else moved the task, and the node fails.
 */
export async function commitStep(s: StepInput): Promise<number> {
  const step = STEPS[s.agent];
  const actor = actorOf(s.agent);
  const reason = `${s.agent}: ${step.from} -> ${step.to}`;
  const task = await s.store.get(s.taskId);
  if (!task) throw new Error(`task ${s.taskId} does not exist`);
  const r = await s.store.update({
    taskId: s.taskId,
    expectedVersion: s.expectedVersion,
    actor,
    reason,
    patch: {
      status: step.to,
      gates: step.gates,
      artifacts: step.artifacts(s.taskId),
      active_agents: step.to === 'complete' ? [] : [s.agent],
      completed_agents: [...task.completed_agents, s.agent],
      budget: {
        currency_spent_usd: task.budget.currency_spent_usd + 0.01,
        tokens_spent: task.budget.tokens_spent + s.summary.length,
        hops_used: task.budget.hops_used + 1,
      },
    },
    messages: [
      {
        topic: s.topic,
        payload: { task: s.taskId, status: step.to, by: s.agent, summary: s.summary },
        // The same step of the same task always has the same message id.
        idempotencyKey: `${s.taskId}/${s.agent}`,
      },
    ],
    ...(s.lease ? { lease: s.lease } : {}),
  });
  if (r.ok) return r.state.version;
  const next = (await s.store.history(s.taskId)).find((a) => a.version === s.expectedVersion + 1);
  if (next?.actor === actor && next.reason === reason) return next.version;
  throw r.error;
}
