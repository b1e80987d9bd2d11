import { z } from 'zod';

export const CHECKPOINT_V1 = 'oaies.checkpoint.v1';
export const CHECKPOINT_V2 = 'oaies.checkpoint.v2';

const Digest = z.string().regex(/^sha256:[0-9a-f]{64}$/, { message: 'must be sha256:<64 hex digits>' });
const Iso = z.iso.datetime({ offset: true });

export const PendingWork = z.strictObject({
  agent_id: z.string().min(1),
  lease_id: z.string().optional(),
  message_id: z.string().optional(),
  receipt_id: z.string().optional(),
});

export const CheckpointV2 = z.strictObject({
  schema_version: z.literal(CHECKPOINT_V2),
  checkpoint_id: z.uuid(),
  task_id: z.string().min(1),
  state_version: z.number().int().min(1),
  created_at: Iso,
  created_by: z.string().min(1),
  /** Why the checkpoint was taken: the semantic boundary it marks. */
  reason: z.string().min(1),
  workflow_definition_digest: Digest.nullable(),
  // null only for checkpoints upcast from v1, which did not record them.
  input_digest: Digest.nullable(),
  output_digest: Digest.optional(),
  state_snapshot_uri: z.string().min(1),
  pending_work: z.array(PendingWork),
  tool_receipt_ids: z.array(z.string()),
  budget_consumed: z.strictObject({
    currency_usd: z.number().nonnegative(),
    tokens: z.number().int().nonnegative(),
    hops: z.number().int().nonnegative(),
  }),
  provenance: z.strictObject({
    last_message_id: z.string().nullable(),
    delegation_hash: Digest.nullable(),
    policy_version: z.string().nullable(),
  }),
  integrity: z.strictObject({
    snapshot_digest: Digest,
    /** Digest of the task's previous checkpoint (its canonical document without signature): a chain. */
    previous_checkpoint_digest: Digest.nullable(),
    signature: z
      .strictObject({ alg: z.literal('HMAC-SHA256'), key_id: z.string().min(1), value: z.string() })
      .optional(),
  }),
});
export type Checkpoint = z.infer<typeof CheckpointV2>;

/** What checkpoints looked like before v2: no pending work, budget, provenance or chain. */
export const CheckpointV1 = z.strictObject({
  schema_version: z.literal(CHECKPOINT_V1),
  checkpoint_id: z.uuid(),
  task_id: z.string().min(1),
  state_version: z.number().int().min(1),
  created_at: Iso,
  created_by: z.string().min(1),
  workflow_definition_digest: Digest,
  state_snapshot_uri: z.string().min(1),
  snapshot_digest: Digest,
  tool_receipt_ids: z.array(z.string()),
});
export type CheckpointV1 = z.infer<typeof CheckpointV1>;

/**
 * v1 → v2. The budget consumed is read from the snapshot (the TaskState it points at), which
 * is real data; what v1 never recorded (input digest, provenance, chain, signature) stays
 * null or absent, never invented. Pending work was not recorded: empty.
 */
export function upcastCheckpointV1(
  v1: CheckpointV1,
  snapshotBudget: { currency_spent_usd: number; tokens_spent: number; hops_used: number } | undefined,
): Checkpoint {
  return {
    schema_version: CHECKPOINT_V2,
    checkpoint_id: v1.checkpoint_id,
    task_id: v1.task_id,
    state_version: v1.state_version,
    created_at: v1.created_at,
    created_by: v1.created_by,
    reason: 'upcast from oaies.checkpoint.v1',
    workflow_definition_digest: v1.workflow_definition_digest,
    input_digest: null,
    state_snapshot_uri: v1.state_snapshot_uri,
    pending_work: [],
    tool_receipt_ids: v1.tool_receipt_ids,
    budget_consumed: {
      currency_usd: snapshotBudget?.currency_spent_usd ?? 0,
      tokens: snapshotBudget?.tokens_spent ?? 0,
      hops: snapshotBudget?.hops_used ?? 0,
    },
    provenance: { last_message_id: null, delegation_hash: null, policy_version: null },
    integrity: { snapshot_digest: v1.snapshot_digest, previous_checkpoint_digest: null },
  };
}
