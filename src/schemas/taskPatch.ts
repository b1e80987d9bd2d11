import { z } from 'zod';
import { Artifacts, Budget, Gates, STATUSES, TaskId, TenantId } from './taskState.js';

const AgentList = z.array(z.string().min(1).max(200));

/** What `update` may change. Strict: an unknown key (a typo, an invented field) is refused. */
export const TaskPatch = z.strictObject({
  status: z.enum(STATUSES).optional(),
  gates: Gates.partial().optional(),
  artifacts: Artifacts.optional(),
  active_agents: AgentList.optional(),
  completed_agents: AgentList.optional(),
  failed_agents: AgentList.optional(),
  budget: z
    .strictObject({
      currency_committed_usd: z.number().finite().nonnegative(),
      currency_spent_usd: z.number().finite().nonnegative(),
      tokens_spent: z.number().int().nonnegative(),
      hops_used: z.number().int().nonnegative(),
    })
    .partial()
    .optional(),
  workflow_digest: z.string().optional(),
  intent_id: z.string().optional(),
});
export type TaskPatch = z.input<typeof TaskPatch>;

/** What `create` takes; everything else starts empty (status planning, gates false). */
export const NewTask = z.strictObject({
  tenant_id: TenantId,
  task_id: TaskId,
  workflow_digest: z.string(),
  intent_id: z.string(),
  budget: Budget.optional(),
  status: z.enum(STATUSES).optional(),
  gates: Gates.partial().optional(),
  artifacts: Artifacts.optional(),
  active_agents: AgentList.optional(),
});
export type NewTask = z.input<typeof NewTask>;
