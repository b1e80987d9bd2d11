import type { ColumnType, Generated, JSONColumnType } from 'kysely';

/** Row types of Cairn's tables, kept beside the migrations that create them. */
export interface TaskStateTable {
  task_id: string;
  tenant_id: string;
  version: number;
  schema_version: string;
  status: string;
  doc: JSONColumnType<Record<string, unknown>>;
  created_at: ColumnType<Date, Date | string | undefined, never>;
  updated_at: ColumnType<Date, Date | string | undefined, Date | string>;
}

export interface TaskAuditTable {
  task_id: string;
  version: number;
  prev_version: number | null;
  tenant_id: string;
  actor: string;
  reason: string | null;
  patch: JSONColumnType<unknown[]>;
  at: Generated<Date>;
}

export interface OutboxTable {
  id: Generated<number>;
  lane: number;
  message_id: string;
  tenant_id: string | null;
  /** The task whose change caused the message, its version and the message's place in that change (0008). */
  task_id: string | null;
  task_version: number | null;
  task_seq: number | null;
  topic: string;
  key: string;
  /** The caller's headers; the relay adds Cairn's own (src/outbox/wire.ts) from the columns. */
  headers: JSONColumnType<Record<string, string>>;
  payload: Buffer;
  created_at: Generated<Date>;
  attempts: Generated<number>;
  last_error: string | null;
  /** A WAL message the relay moved into the table (migration 0019): the relay's row alone. */
  from_wal: Generated<boolean>;
}

/**
 * Outbox messages written to the WAL only (migration 0019): a row inserted here is checked and
 * becomes a logical decoding message for the WAL relay; nothing is stored.
 */
export interface OutboxWalTable {
  message_id: string;
  tenant_id: string | null;
  task_id: string | null;
  task_version: number | null;
  task_seq: number | null;
  topic: string;
  key: string;
  headers: JSONColumnType<Record<string, string>>;
  payload: Buffer;
  created_at: Generated<Date>;
}

/** The slots of WAL relays that read outbox messages (0019): writing one needs such a slot. */
export interface OutboxWalReaderTable {
  slot_name: string;
  timeline: string;
  registered_at: Generated<Date>;
}

export interface RelayLaneTable {
  lane: number;
  owner: string | null;
  fencing_token: Generated<number>;
  expires_at: Generated<Date>;
}

export interface RelayInstanceTable {
  instance_id: string;
  started_at: Generated<Date>;
  last_seen: Generated<Date>;
}

export interface OutboxParkedKeyTable {
  /** The message's tenant, '' for none: keys are parked per tenant. */
  tenant: Generated<string>;
  topic: string;
  key: string;
  message_id: string;
  error: string;
  parked_at: Generated<Date>;
}

export interface OutboxOperatorAuditTable {
  id: Generated<number>;
  action: 'release' | 'skip';
  tenant: string | null;
  topic: string | null;
  key: string | null;
  message_id: string | null;
  actor: string;
  reason: string;
  detail: JSONColumnType<Record<string, unknown>>;
  at: Generated<Date>;
}

export interface InboxTable {
  consumer_group: string;
  message_id: string;
  topic: string;
  partition: number;
  offset: number;
  outcome: Generated<'applied' | 'stale' | 'dead_lettered'>;
  tenant_id: Generated<string | null>;
  key: string | null;
  applied_at: Generated<Date>;
}

export interface InboxKeyVersionTable {
  consumer_group: string;
  tenant_id: Generated<string | null>;
  key: string;
  version: number;
  /** The newest applied message's place within its change (cairn-task-seq). */
  seq: Generated<number>;
}

export interface InboxDlqTable {
  id: Generated<number>;
  consumer_group: string;
  tenant_id: Generated<string | null>;
  message_id: string;
  topic: string;
  partition: number;
  offset: number;
  key: string | null;
  headers: JSONColumnType<Record<string, string>>;
  payload: Buffer | null;
  error: string;
  attempts: number;
  dead_at: Generated<Date>;
  replayed_at: Date | null;
}

export interface TaskLeaseTable {
  task_id: string;
  branch: string;
  tenant_id: Generated<string | null>;
  holder: string | null;
  lease_id: string | null;
  fencing_token: number;
  acquired_at: Generated<Date>;
  expires_at: Date;
}

export type ReceiptStatus =
  | 'started'
  | 'succeeded'
  | 'failed'
  | 'uncertain'
  | 'compensating'
  | 'compensated'
  | 'gated';

export interface ToolReceiptTable {
  receipt_id: string;
  idempotency_key: string;
  task_id: string;
  step: string;
  tool: string;
  args_digest: string;
  status: ReceiptStatus;
  attempt: Generated<number>;
  irreversible: Generated<boolean>;
  worker: string;
  lease_task_id: string | null;
  lease_branch: string | null;
  lease_id: string | null;
  fencing_token: number | null;
  result: ColumnType<unknown, string | null, string | null>;
  result_digest: string | null;
  /** The result encrypted with the tenant's data key `result_key_id` (then `result` is null). */
  result_enc: Buffer | null;
  result_key_id: string | null;
  tenant_id: Generated<string | null>;
  error: string | null;
  resolution: string | null;
  started_at: Generated<Date>;
  finished_at: Date | null;
}

export interface CheckpointSnapshotTable {
  snapshot_id: string;
  task_id: string;
  tenant_id: Generated<string | null>;
  bytes: Buffer;
  /** The tenant data key that encrypted `bytes`; null: stored in the clear (no key ring). */
  key_id: string | null;
  created_at: Generated<Date>;
}

export interface CheckpointTable {
  checkpoint_id: string;
  task_id: string;
  seq: number;
  state_version: number;
  schema_version: string;
  reason: string;
  doc: JSONColumnType<Record<string, unknown>>;
  digest: string;
  tenant_id: Generated<string | null>;
  data_class: Generated<DataClass>;
  created_at: Generated<Date>;
}

export type DataClass = 'public' | 'internal' | 'confidential';

export interface TenantTable {
  tenant_id: string;
  /** The tenant's login role (0008): what row-level security keys on. */
  role_name: string | null;
  created_at: Generated<Date>;
}

export interface TenantKeyTable {
  key_id: string;
  tenant_id: string;
  kek_id: string;
  wrapped_key: Buffer;
  created_at: Generated<Date>;
  rewrapped_at: Date | null;
}

export interface RetentionPolicyTable {
  tenant_id: string;
  data_class: DataClass;
  retain_days: ColumnType<number, number, number>;
  updated_at: Generated<Date>;
}

export interface LegalHoldTable {
  hold_id: string;
  tenant_id: string;
  task_id: string | null;
  reason: string;
  placed_by: string;
  placed_at: Generated<Date>;
  released_by: string | null;
  released_at: Date | null;
}

export interface TaskAnnotationTable {
  annotation_id: string;
  tenant_id: string;
  task_id: string;
  author: string;
  body: string;
  at: Generated<Date>;
}

export interface DeletionCertificateTable {
  certificate_id: string;
  run_id: string;
  tenant_id: string;
  issued_at: Generated<Date>;
  body: JSONColumnType<Record<string, unknown>>;
  digest: string;
}

export interface TaskQuarantineTable {
  task_id: string;
  tenant_id: Generated<string | null>;
  reason: string;
  placed_by: string;
  placed_at: Generated<Date>;
  released_by: string | null;
  released_at: Date | null;
}

export interface ConsoleActionTable {
  id: Generated<number>;
  request_id: string;
  actor: string;
  role: 'read' | 'operator';
  scope_tenant: string | null;
  action: string;
  target: string;
  outcome: Generated<'pending' | 'done' | 'already' | 'refused' | 'failed'>;
  detail: string | null;
  at: Generated<Date>;
  finished_at: Date | null;
}

/** Cairn's tables and their column types, as kysely sees them (kept in step with the migrations). */
export interface Database {
  task_quarantine: TaskQuarantineTable;
  console_action: ConsoleActionTable;
  tenant: TenantTable;
  tenant_key: TenantKeyTable;
  retention_policy: RetentionPolicyTable;
  legal_hold: LegalHoldTable;
  task_annotation: TaskAnnotationTable;
  deletion_certificate: DeletionCertificateTable;
  checkpoint: CheckpointTable;
  checkpoint_snapshot: CheckpointSnapshotTable;
  task_lease: TaskLeaseTable;
  tool_receipt: ToolReceiptTable;
  inbox: InboxTable;
  inbox_key_version: InboxKeyVersionTable;
  inbox_dlq: InboxDlqTable;
  task_state: TaskStateTable;
  task_audit: TaskAuditTable;
  outbox: OutboxTable;
  outbox_wal: OutboxWalTable;
  outbox_wal_reader: OutboxWalReaderTable;
  relay_lane: RelayLaneTable;
  relay_instance: RelayInstanceTable;
  outbox_parked_key: OutboxParkedKeyTable;
  outbox_operator_audit: OutboxOperatorAuditTable;
}
