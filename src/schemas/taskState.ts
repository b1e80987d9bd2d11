import { z } from 'zod';

/**
 * TaskState schemas. Every object is strict: an unknown key is refused, never dropped.
 * v1 rows are read through `upcastTaskState`, an explicit upcaster; nothing is guessed.
 */

export const TASK_STATE_V1 = 'oaies.task-state.v1';
export const TASK_STATE_V2 = 'oaies.task-state.v2';

/**
 * Every status a task can have, in workflow order; `complete`, `cancelled` and `failed` are
 * terminal.
 */
export const STATUSES = [
  'planning',
  'implementing',
  'reviewing',
  'testing',
  'complete',
  'failed',
  'cancelled',
  'expired',
] as const;
export const V1_STATUSES = [
  'planning',
  'implementing',
  'reviewing',
  'testing',
  'complete',
  'failed',
] as const;
/** The gates a task passes on its way (each a boolean in `gates`). */
export const GATES = [
  'plan_approved',
  'implementation_complete',
  'review_passed',
  'tests_passing',
  'security_approved',
  'deployment_approved',
] as const;

/** One of STATUSES. */
export type TaskStatus = (typeof STATUSES)[number];
/** One of GATES. */
export type GateName = (typeof GATES)[number];

/** `spiffe://<trust-domain>/<path>`: trust domain in lower case, a non-empty path. */
export const SPIFFE_ID = /^spiffe:\/\/[a-z0-9._-]+(\/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)+$/;
export const SpiffeId = z
  .string()
  .max(2048)
  .regex(SPIFFE_ID, { message: 'must be a SPIFFE ID of the form spiffe://<trust-domain>/<path>' });

export const TenantId = z.string().regex(/^[a-z0-9][a-z0-9._-]{0,62}$/, {
  message: 'must be 1-63 of a-z 0-9 . _ -, starting with a letter or digit',
});
export const TaskId = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$/, { message: 'must be 1-200 of A-Z a-z 0-9 . _ : -' });
const AgentId = z.string().min(1).max(200);
const Sha256Digest = z.string().regex(/^sha256:[0-9a-f]{64}$/, { message: 'must be sha256:<64 hex digits>' });
/** A pointer to an artifact, or (as stored) its envelope when the artifact is confidential (src/state/fieldCrypto.ts). */
const Pointer = z.union([
  z.string().min(1).max(2048),
  z
    .string()
    .max(4096)
    .regex(/^cairn:enc:v1:[A-Za-z0-9_.-]{1,128}:[A-Za-z0-9_-]+$/),
]);

export const Gates = z.strictObject(
  Object.fromEntries(GATES.map((g) => [g, z.boolean()])) as Record<GateName, z.ZodBoolean>,
);
export type Gates = z.infer<typeof Gates>;

export const Artifacts = z.strictObject({
  implementation_plan: Pointer.optional(),
  code_files: z.array(Pointer).max(10_000).optional(),
  test_results: Pointer.optional(),
  review_report: Pointer.optional(),
});

const Usd = z.number().finite().nonnegative();
const Count = z.number().int().nonnegative();

export const Budget = z
  .strictObject({
    currency_committed_usd: Usd,
    currency_spent_usd: Usd,
    tokens_spent: Count,
    hops_used: Count,
  })
  .superRefine((b, ctx) => {
    if (b.currency_spent_usd > b.currency_committed_usd) {
      ctx.addIssue({
        code: 'custom',
        message: `must not exceed currency_committed_usd (${b.currency_committed_usd})`,
        path: ['currency_spent_usd'],
      });
    }
  });

const common = {
  tenant_id: TenantId,
  task_id: TaskId,
  version: z.number().int().min(1),
  gates: Gates,
  artifacts: Artifacts,
  active_agents: z.array(AgentId),
  completed_agents: z.array(AgentId),
  failed_agents: z.array(AgentId),
  updated_at: z.iso.datetime({ offset: true }),
  updated_by: SpiffeId,
};

export const TaskStateV2 = z.strictObject({
  schema_version: z.literal(TASK_STATE_V2),
  ...common,
  status: z.enum(STATUSES),
  budget: Budget,
  // null only for tasks upcast from v1, which never recorded them (see upcastTaskState).
  workflow_digest: Sha256Digest.nullable(),
  intent_id: z.string().min(1).max(200).nullable(),
});
/**
 * The task document (schema oaies.task-state.v2): status, gates, artifacts, budget, active
 * agents and its version.
 */
export type TaskState = z.infer<typeof TaskStateV2>;

export const TaskStateV1 = z.strictObject({
  schema_version: z.literal(TASK_STATE_V1),
  ...common,
  tenant_id: TenantId.optional(),
  status: z.enum(V1_STATUSES),
});
export type TaskStateV1 = z.infer<typeof TaskStateV1>;

/**
 * v1 → v2. v1 knew no budget, workflow digest or intent: the budget starts at zero
 * committed (so any spend is refused until someone commits budget: fail closed), and the
 * digest and intent are null ("unknown, predates v2"), never invented.
 */
export function upcastV1(v1: TaskStateV1, tenantId: string): TaskState {
  return {
    ...v1,
    schema_version: TASK_STATE_V2,
    tenant_id: v1.tenant_id ?? tenantId,
    budget: { currency_committed_usd: 0, currency_spent_usd: 0, tokens_spent: 0, hops_used: 0 },
    workflow_digest: null,
    intent_id: null,
  };
}
