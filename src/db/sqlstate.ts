import { CairnError, ConfigurationError, InvalidTransitionError } from '../errors.js';
import type { Database } from './types.js';

/** Cairn's tables: a missing one means the database was never migrated (kept in step with Database by its type). */
const CAIRN_TABLES: Readonly<Record<keyof Database, true>> = {
  task_quarantine: true,
  console_action: true,
  tenant: true,
  tenant_key: true,
  retention_policy: true,
  legal_hold: true,
  task_annotation: true,
  deletion_certificate: true,
  checkpoint: true,
  checkpoint_snapshot: true,
  task_lease: true,
  tool_receipt: true,
  inbox: true,
  inbox_key_version: true,
  inbox_dlq: true,
  task_state: true,
  task_audit: true,
  outbox: true,
  outbox_wal: true,
  outbox_wal_reader: true,
  relay_lane: true,
  relay_instance: true,
  outbox_parked_key: true,
  outbox_operator_audit: true,
};

/**
 * Every SQLSTATE Cairn reacts to is mapped here and nowhere else.
 * https://www.postgresql.org/docs/15/errcodes-appendix.html
 */
export const SqlState = {
  uniqueViolation: '23505',
  checkViolation: '23514',
  foreignKeyViolation: '23503',
  serializationFailure: '40001',
  deadlockDetected: '40P01',
  lockNotAvailable: '55P03',
  raiseException: 'P0001',
  adminShutdown: '57P01',
  crashShutdown: '57P02',
  cannotConnectNow: '57P03',
  tooManyConnections: '53300',
  // A write on a server that takes none (a standby not promoted yet).
  readOnlyTransaction: '25006',
  queryCanceled: '57014',
  // The connection has no prepared statement of that name (DEALLOCATE ALL ran on it): src/db/pool.ts.
  invalidSqlStatementName: '26000',
  // Refused at connect: a wrong password or user, a pg_hba.conf rule, a database that does not exist.
  invalidPassword: '28P01',
  invalidAuthorization: '28000',
  invalidCatalogName: '3D000',
  // A Cairn table is missing: the database was never migrated.
  undefinedTable: '42P01',
  // A Cairn function is missing: the database is not migrated to this version.
  undefinedFunction: '42883',
  // Raised by Cairn's own triggers (migrations/0001_task_state.ts).
  taskTerminal: 'CN001',
  undeclaredTransition: 'CN002',
  versionNotPlusOne: 'CN003',
  identityChanged: 'CN004',
  budgetDecreased: 'CN005',
  auditAppendOnly: 'CN006',
  checkpointImmutable: 'CN007',
  legalHold: 'CN008',
  quarantined: 'CN009',
  // Row-level security refused a row of another tenant (or no tenant was set).
  insufficientPrivilege: '42501',
} as const;

/** Turns an error raised by Cairn's SQL guards into the typed error the code would have thrown. */
export function mapSqlError(err: unknown): unknown {
  const state = sqlState(err);
  const message = (err as Error).message;
  switch (state) {
    case SqlState.taskTerminal:
    case SqlState.undeclaredTransition:
    case SqlState.identityChanged:
      return new InvalidTransitionError(message);
    case SqlState.versionNotPlusOne:
    case SqlState.budgetDecreased:
    case SqlState.auditAppendOnly:
    case SqlState.checkViolation:
      return new CairnError('invariant_violated', message, { cause: err });
    case SqlState.legalHold:
      return new CairnError('legal_hold', message, { cause: err });
    case SqlState.quarantined:
      return new CairnError('quarantined', message, { cause: err });
    case SqlState.undefinedTable:
      return notMigrated(err, message) ?? err;
    case SqlState.insufficientPrivilege:
      return /row-level security/.test(message)
        ? new CairnError(
            'tenant_isolation',
            `${message}: this connection acts for another tenant (the tenant role forTenant logs in as) or for none`,
            { cause: err },
          )
        : err;
    default:
      return err;
  }
}

/** `mapSqlError` as a `.catch` handler: `await q.execute().catch(rethrowMapped)`. */
export function rethrowMapped(err: unknown): never {
  throw mapSqlError(err);
}

/**
 * 42P01 on one of Cairn's own tables: the database was never migrated (or not to this
 * version). Anything else (a table of the application's) stays the error Postgres raised.
 */
function notMigrated(err: unknown, message: string): ConfigurationError | undefined {
  const table = /relation "(?:[^"]+\.)?([^"]+)" does not exist/.exec(message)?.[1];
  if (!table || !Object.hasOwn(CAIRN_TABLES, table)) return undefined;
  return new ConfigurationError(
    `the database has no Cairn table "${table}" (${message}): it was never migrated; ` +
      'run `cairn migrate` first (or `await migrateToLatest(db)` from code)',
    err,
  );
}

export function sqlState(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}

/** Errors where running the same transaction again may succeed. */
export function isRetriableSqlError(err: unknown): boolean {
  const state = sqlState(err);
  return (
    state === SqlState.serializationFailure ||
    state === SqlState.deadlockDetected ||
    state === SqlState.lockNotAvailable ||
    isConnectionLoss(err)
  );
}

/**
 * Postgres not serving now, whatever the statement: the connection lost (isConnectionLoss), a
 * statement stalled past its timeout (57014), a server that takes no writes yet (25006: a
 * standby being promoted). What a run or a command may not take for a finding.
 */
export function isDatabaseOutage(err: unknown): boolean {
  const state = sqlState(err);
  return isConnectionLoss(err) || state === SqlState.queryCanceled || state === SqlState.readOnlyTransaction;
}

/**
 * The connection failed or was closed (the server restarting or shutting down, the network
 * cut, too many connections), whatever the statement was. Says nothing on its own about whose
 * connection: a handler's call to another service can fail with ECONNREFUSED too, so callers
 * ask the database (pingDatabase) before they take it for an outage of Postgres.
 */
export function isConnectionLoss(err: unknown): boolean {
  const state = sqlState(err);
  if (state) {
    return (
      state === SqlState.adminShutdown ||
      state === SqlState.crashShutdown ||
      state === SqlState.cannotConnectNow ||
      state === SqlState.tooManyConnections ||
      state.startsWith('08') // connection exceptions
    );
  }
  const code = (err as { code?: unknown } | null)?.code;
  const message = (err as Error | null)?.message ?? '';
  return (
    code === 'ECONNREFUSED' ||
    code === 'ECONNRESET' ||
    code === 'EPIPE' ||
    code === 'ETIMEDOUT' ||
    /Connection terminated|terminating connection|Client has encountered a connection error|timeout exceeded when trying to connect/i.test(
      message,
    )
  );
}

/**
 * Errors at connect that no amount of waiting fixes: the credentials, the database name or
 * the connection string itself are wrong. Anything else at connect (refused, timed out, the
 * server starting up: 57P03) is an outage, and a process waits for it.
 */
export function isConfigurationSqlError(err: unknown): boolean {
  const state = sqlState(err);
  if (state) {
    return (
      state === SqlState.invalidPassword ||
      state === SqlState.invalidAuthorization ||
      state === SqlState.invalidCatalogName
    );
  }
  const code = (err as { code?: unknown } | null)?.code;
  return code === 'ERR_INVALID_URL' || code === 'ERR_SOCKET_BAD_PORT';
}

export function isUniqueViolation(err: unknown, constraint?: string): boolean {
  if (sqlState(err) !== SqlState.uniqueViolation) return false;
  return constraint === undefined || (err as { constraint?: string }).constraint === constraint;
}
