/**
 * One error base for everything Cairn throws. `code` is stable (callers switch on it),
 * `retriable` says whether the same call may succeed later (the idea kafkajs uses), and the
 * ES2022 `cause` keeps the underlying error.
 */
export class CairnError extends Error {
  readonly code: string;
  readonly retriable: boolean;

  constructor(code: string, message: string, opts: { retriable?: boolean; cause?: unknown } = {}) {
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

export class NotFoundError extends CairnError {
  constructor(what: string, id: string) {
    super('not_found', `${what} ${id} does not exist`);
  }
}

/** Postgres or Kafka could not be reached, or the connection dropped: the caller may retry. */
export class UnavailableError extends CairnError {
  constructor(message: string, cause?: unknown) {
    super('unavailable', message, { retriable: true, cause });
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

export function preview(value: unknown, max = 80): string {
  let text: string;
  try {
    text = typeof value === 'string' ? JSON.stringify(value) : (JSON.stringify(value) ?? String(value));
  } catch {
    text = String(value);
  }
  return text.length > max ? `${text.slice(0, max)}…` : text;
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
