/**
 * Every `code` a {@link CairnError} can carry, one constant each: switch on
 * `err.code === CairnErrorCodes.StaleVersion` rather than on a string typed by hand. Codes
 * are stable: one is never renamed or given another meaning within a major version.
 */
export const CairnErrorCodes = {
  /** Input that does not match a schema or a rule ({@link ValidationError}). */
  ValidationFailed: 'validation_failed',
  /** A write named a version that is no longer current ({@link StaleWriteError}). */
  StaleVersion: 'stale_version',
  /** A transition the state machine does not declare ({@link InvalidTransitionError}). */
  InvalidTransition: 'invalid_transition',
  /** The task, receipt, dead letter or other row named does not exist ({@link NotFoundError}). */
  NotFound: 'not_found',
  /** A row that must be new already exists (a task created twice). */
  AlreadyExists: 'already_exists',
  /** A dead letter replayed after its message was applied: nothing was sent. */
  AlreadyApplied: 'already_applied',
  /** Postgres or Kafka is down or dropped the connection; retriable ({@link UnavailableError}). */
  Unavailable: 'unavailable',
  /** A setting that can never work as given ({@link ConfigurationError}). */
  Configuration: 'configuration',
  /** A topic a consumer reads does not exist ({@link TopicMissingError}). */
  TopicMissing: 'topic_missing',
  /** A publisher used before `connect()` (or after `disconnect()`). */
  NotConnected: 'not_connected',
  /** The broker refused or lost a batch; the relay retries it (retriable). */
  PublishFailed: 'publish_failed',
  /** An outbox row that can never be published as it is (its key is parked). */
  UnpublishableRow: 'unpublishable_row',
  /** The lease a write relies on is no longer current ({@link LeaseLostError}). */
  LeaseLost: 'lease_lost',
  /** Another holder has the lease; retriable after its expiry ({@link LeaseHeldError}). */
  LeaseHeld: 'lease_held',
  /** A database guard refused a write that would break an invariant (version, budget, audit). */
  InvariantViolated: 'invariant_violated',
  /** Rows under a legal hold cannot be deleted. */
  LegalHold: 'legal_hold',
  /** The task is quarantined after a failover: its state and effects are frozen. */
  Quarantined: 'quarantined',
  /** Row-level security refused a row of another tenant, or no tenant was set. */
  TenantIsolation: 'tenant_isolation',
  /** A tenant that was never registered (`cairn tenant add`). */
  UnknownTenant: 'unknown_tenant',
  /** An annotation id that already holds another author or text. */
  AnnotationConflict: 'annotation_conflict',
  /** An effect's call was cut off after its request left: it may have done its work ({@link OutcomeUnknownError}). */
  OutcomeUnknown: 'outcome_unknown',
  /** A data key, key-encryption key or signing key that is not there (shredded, or not configured). */
  KeyMissing: 'key_missing',
  /**
   * A tenant's data key that does not unwrap under the key provider's key-encryption key (a
   * keyring of another region or deployment under the same key ids, a KMS key that refuses):
   * nothing was decrypted and nothing is concluded about the data, an outage (retriable).
   */
  KeyUnavailable: 'key_unavailable',
  /** A data key of another tenant was offered: nothing was decrypted. */
  WrongTenantKey: 'wrong_tenant_key',
  /** A payload that fails its own authentication under its data key (altered bytes, not Cairn's format): corruption. */
  DecryptionFailed: 'decryption_failed',
  /** Confidential data where no tenant keys were configured to encrypt it. */
  EncryptionRequired: 'encryption_required',
  /** A keyring file that cannot be read. */
  KeyringUnreadable: 'keyring_unreadable',
  /** A keyring file that group or others may read. */
  KeyringMode: 'keyring_mode',
  /** A keyring file that already exists where a new one was to be made. */
  KeyringExists: 'keyring_exists',
  /** Another process is writing the keyring file. */
  KeyringBusy: 'keyring_busy',
  /** Writing a keyring file failed. */
  KeyringWriteFailed: 'keyring_write_failed',
  /** A migration failed; the database is left at the last migration that succeeded. */
  MigrationFailed: 'migration_failed',
  /** A checkpoint taken under another workflow definition than the resuming agent's. */
  WorkflowMismatch: 'workflow_mismatch',
  /** The current policy does not allow what was asked (resuming a task). */
  NotAuthorized: 'not_authorized',
  /** A LangGraph checkpoint put that would fork its thread, or overwrite a checkpoint (CairnSaver). */
  CheckpointConflict: 'checkpoint_conflict',
  /** A LangGraph checkpoint asked for by id failed verification: it is never returned (CairnSaver). */
  CheckpointInvalid: 'checkpoint_invalid',
  /** The `cairn` command line was given an unknown command or bad arguments (exit 2). */
  Usage: 'usage',
  /** An inbox handler's transaction ran past `handlerTimeoutMs`: its session was ended, nothing of it committed (retriable). */
  HandlerTimeout: 'handler_timeout',
} as const;

/** One of {@link CairnErrorCodes}: the stable `code` of a {@link CairnError}. */
export type CairnErrorCode = (typeof CairnErrorCodes)[keyof typeof CairnErrorCodes];

/**
 * One error base for everything Cairn throws. `code` is stable (callers switch on it),
 * `retriable` says whether the same call may succeed later (the idea kafkajs uses), and the
 * ES2022 `cause` keeps the underlying error.
 */
export class CairnError extends Error {
  /** What went wrong, stable across releases: one of {@link CairnErrorCodes}. */
  readonly code: CairnErrorCode;
  /** Whether the same call may succeed if made again later (an outage, a held lease). */
  readonly retriable: boolean;

  constructor(code: CairnErrorCode, message: string, opts: { retriable?: boolean; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    this.code = code;
    this.retriable = opts.retriable ?? false;
  }
}

/** Input that does not match a schema or a rule; names the field, the value and the rule. */
export class ValidationError extends CairnError {
  readonly issues: ReadonlyArray<{ path: string; message: string; value?: unknown }>;

  constructor(
    what: string,
    issues: ReadonlyArray<{ path: string; message: string; value?: unknown }>,
    opts: { cause?: unknown } = {},
  ) {
    const lines = issues.map(
      (i) =>
        `${i.path || '(root)'}: ${i.message}${i.value === undefined ? '' : ` (got ${preview(i.value)})`}`,
    );
    super('validation_failed', `invalid ${what}: ${lines.join('; ')}`, opts);
    this.issues = issues;
  }
}

/** A write named a version that is no longer current; nothing was changed. */
export class StaleWriteError extends CairnError {
  constructor(
    readonly taskId: string,
    readonly expectedVersion: number,
    readonly currentVersion: number | undefined,
  ) {
    super(
      'stale_version',
      `stale write on task ${taskId}: expected version ${expectedVersion} but the current version is ` +
        `${currentVersion ?? '(task does not exist)'}; re-read the task and apply the change to the current version`,
    );
  }
}

/** A transition the state machine does not declare, or a change to a terminal task. */
export class InvalidTransitionError extends CairnError {
  constructor(message: string) {
    super('invalid_transition', message);
  }
}

/** The task, receipt, dead letter or other row named does not exist. */
export class NotFoundError extends CairnError {
  constructor(what: string, id: string) {
    super('not_found', `${what} ${id} does not exist`);
  }
}

/**
 * Postgres, Kafka or a key provider could not be reached, or the connection dropped: the caller
 * may retry. `refused` tells a dependency that answered and said no (a key provider that denies
 * a tenant's key, or does not have it) from one that did not answer: it is up, and what it
 * refuses may be set right (a key enabled again), but waiting for it is not waiting out an outage.
 */
export class UnavailableError extends CairnError {
  /** The dependency answered and refused; false when it did not answer (an outage). */
  readonly refused: boolean;
  /**
   * How many calls the dependency has answered so far, when it keeps count (TenantKeys does):
   * a count that rises while it works for others. Without it a waiting consumer can only go
   * by the messages it applies, and those need not have called it.
   */
  readonly answers?: () => number;
  /** What was refused, when it was one thing (a tenant's data key): later failures on it are alike. */
  readonly subject?: string;

  constructor(
    message: string,
    cause?: unknown,
    opts: { refused?: boolean; answers?: () => number; subject?: string } = {},
  ) {
    super('unavailable', message, { retriable: true, cause });
    this.refused = opts.refused ?? false;
    if (opts.answers) this.answers = opts.answers;
    if (opts.subject !== undefined) this.subject = opts.subject;
  }
}

/**
 * A setting that can never work as given (a malformed DATABASE_URL or KAFKA_BROKERS, a
 * password the server refuses, a database that does not exist): waiting will not help, so
 * a process exits with ExitCode.configuration and this message.
 */
export class ConfigurationError extends CairnError {
  constructor(message: string, cause?: unknown) {
    super('configuration', message, { cause });
  }
}

/**
 * A topic a consumer subscribes to does not exist (or the broker refused to create it).
 * Waiting will not help: someone has to create it, or the subscriber is told to.
 */
export class TopicMissingError extends CairnError {
  constructor(
    readonly topics: readonly string[],
    message: string,
    cause?: unknown,
  ) {
    super('topic_missing', message, { cause });
  }
}

/** What a caught value says: an Error's message, else the value itself (a handler may throw anything, null included). */
export function messageOf(error: unknown): string {
  return error instanceof Error
    ? error.message
    : `a thrown ${error === null ? 'null' : typeof error}: ${preview(error)}`;
}

/** Whether a caught value says the same call may succeed later (`retriable: false` says no; anything else, yes). */
export function mayRetry(error: unknown): boolean {
  return (error as { retriable?: unknown } | null | undefined)?.retriable !== false;
}

export function preview(value: unknown, max = 80): string {
  // An object that is not plain data (a pool, a client, a Db) may hold a connection string
  // with a password: only its kind is shown.
  if (typeof value === 'function') return `a function${value.name ? ` ${value.name}` : ''}`;
  if (typeof value === 'object' && value !== null && !Array.isArray(value)) {
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null)
      return `an instance of ${proto?.constructor?.name ?? 'a class'}`;
  }
  let text: string;
  try {
    text = typeof value === 'string' ? JSON.stringify(value) : (JSON.stringify(value) ?? String(value));
  } catch {
    text = String(value);
  }
  // A URL's password (a connection string among the values) is never shown.
  text = text.replace(/([a-z][a-z0-9+.-]*:\/\/[^:/@\s"]*:)[^@\s"]*@/gi, '$1***@');
  return text.length > max ? `${text.slice(0, max)}…` : text;
}

/**
 * Throw it from a tool receipt's effect when the call may have done its work though no answer
 * came back (a timeout after the request left, say): the receipt turns uncertain and goes to
 * compensation or a human gate, never to a blind retry. A connection reset, a timeout or an
 * abort thrown by the effect counts the same (src/receipts/outcome.ts).
 */
export class OutcomeUnknownError extends CairnError {
  constructor(message: string, cause?: unknown) {
    super('outcome_unknown', message, { cause });
  }
}

/** The lease this write relies on was lost (expired, taken over, or released): nothing was written. */
export class LeaseLostError extends CairnError {
  constructor(message: string) {
    super('lease_lost', message);
  }
}

/** Another holder has the lease; try again after `expiresAt` (database time). */
export class LeaseHeldError extends CairnError {
  constructor(
    readonly holder: string,
    readonly expiresAt: Date,
    what: string,
  ) {
    super('lease_held', `${what} is held by ${holder} until ${expiresAt.toISOString()}`, { retriable: true });
  }
}
