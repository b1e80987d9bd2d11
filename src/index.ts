/**
 * `@cairn-state/cairn`: the library. What this file exports is public and follows semver;
 * every other module is internal and may change. The relay is `@cairn-state/cairn/relay`,
 * inbox consumers are `@cairn-state/cairn/inbox`. Each name is described in docs/api.md and
 * carries TSDoc, from which `npm run docs:api` builds the API reference.
 *
 * @module @cairn-state/cairn
 */

export {
  type Checkpointer,
  type CheckpointerOptions,
  createCheckpointer,
  type StoredCheckpoint,
  type TakeCheckpointInput,
  type Verification,
} from './checkpoints/checkpoints.js';
export type { Classification, FieldClass } from './checkpoints/classification.js';
export type { KeyRing } from './checkpoints/signing.js';
export type { SnapshotStore, StoredSnapshot } from './checkpoints/snapshotStore.js';
// Tenant keys, retention and legal hold.
export { type KeyProvider, localKeyring, writeKeyring } from './crypto/keyProvider.js';
export { createTenantKeys, type TenantKeys, type TenantKeysOptions } from './crypto/tenantKeys.js';
// The database: connect, migrate, act for a tenant.
export {
  type ConnectionStringOptions,
  createDb,
  type Db,
  type DbOptions,
  type ExistingPoolOptions,
  type PgPool,
  type PgPoolClient,
} from './db/database.js';
export type { Executor, Trx } from './db/executor.js';
export { migrateToLatest, migrationStatus } from './db/migrate.js';
export { forTenant, registerTenant, type TenantLogin } from './db/tenant.js';
export type { Database } from './db/types.js';
// Errors: one base class with a stable `code` and a `retriable` flag.
export {
  CairnError,
  type CairnErrorCode,
  CairnErrorCodes,
  ConfigurationError,
  InvalidTransitionError,
  LeaseHeldError,
  LeaseLostError,
  NotFoundError,
  OutcomeUnknownError,
  StaleWriteError,
  TopicMissingError,
  UnavailableError,
  ValidationError,
} from './errors.js';
// Regional failover: what the check and the changelog replay read the broker with.
export {
  type CommittedOffsets,
  createKafkaAdmin,
  type KafkaAdmin,
  type KafkaAdminOptions,
  type PartitionOffsets,
  type TopicRecord,
} from './kafka/admin.js';
// Leases, receipts, checkpoints, resume.
export {
  type AcquireResult,
  createLeaseManager,
  type Fence,
  type Lease,
  type LeaseManager,
  type LeaseManagerOptions,
  type LeaseRequest,
  type RenewResult,
} from './leases/leases.js';
export { createLogger, type Logger, type LoggerOptions } from './logger.js';
// The outbox and the wire contract its messages carry.
export type { OutboxMessageInput } from './outbox/message.js';
export { createOutbox, type EnqueueContext, type Outbox, type OutboxOptions } from './outbox/outbox.js';
export { HEADER } from './outbox/wire.js';
export {
  createReceiptStore,
  type EffectContext,
  type GateRecord,
  idempotencyKeyOf,
  type ReceiptRow,
  type ReceiptStore,
  type ReceiptStoreOptions,
  type ReconcileAction,
  type RunOnceInput,
  type RunOnceResult,
  type UncertainPolicy,
} from './receipts/receipts.js';
export {
  type AppliedEffect,
  checkAfterFailover,
  type FailoverCheckOptions,
  type FailoverReport,
  type GroupNotJudged,
  type LostConsumption,
  type LostTransition,
  type MissingReceipt,
  type MovedPartition,
  quarantine,
  releaseQuarantine,
  type UnmirroredMessage,
} from './recovery/failover.js';
export { type HoldResult, holdDiverged } from './recovery/failoverHold.js';
export {
  type IncompleteTask,
  type RebuiltTask,
  type RefusedRecord,
  type ReplayChangelogOptions,
  type ReplayReport,
  replayChangelog,
} from './recovery/replayChangelog.js';
export {
  type Policy,
  parsePolicy,
  type ResumeOptions,
  type ResumePlan,
  resume,
  workflowDigestOf,
} from './recovery/resume.js';
export { annotate, type Hold, listHolds, placeHold, releaseHold } from './retention/holds.js';
export {
  type Certificate,
  certificateIntact,
  type RetentionOptions,
  type RetentionRun,
  runRetention,
  setRetentionPolicy,
} from './retention/retention.js';
// Task state: compare-and-swap writes with their audit rows and outbox messages.
export type { NewTask, TaskPatch } from './schemas/taskPatch.js';
export { GATES, type GateName, STATUSES, type TaskState, type TaskStatus } from './schemas/taskState.js';
export {
  CHANGELOG_TOPIC,
  type ChangelogOptions,
  changelogTopicConfig,
  stateDigest,
} from './state/changelog.js';
export {
  type AuditRow,
  createTaskStore,
  type TaskStore,
  type TaskStoreOptions,
  type UpdateInput,
  type UpdateResult,
} from './state/taskStore.js';
export { canTransition, isTerminal, TRANSITIONS } from './state/transitions.js';
