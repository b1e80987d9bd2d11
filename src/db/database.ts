import {
  type Dialect,
  Kysely,
  PostgresAdapter,
  PostgresDialect,
  PostgresIntrospector,
  PostgresQueryCompiler,
  sql,
} from 'kysely';
import { z } from 'zod';
import { ConfigurationError, UnavailableError } from '../errors.js';
import { parseOptions } from '../options.js';
import {
  callerPool,
  createPool,
  defaultSchema,
  type PgPool,
  type PoolSettings,
  SCHEMA_NAME,
} from './pool.js';
import { isConfigurationSqlError } from './sqlstate.js';
import { destroyTenantViews, registerPool } from './tenant.js';
import type { Database } from './types.js';

export type { PgPool, PgPoolClient, PoolSettings } from './pool.js';

const isPool = (v: unknown): v is PgPool =>
  typeof (v as PgPool | null)?.connect === 'function' && typeof (v as PgPool | null)?.end === 'function';

const DbOptionsSchema = z
  .object({
    connectionString: z.string().min(1).optional(),
    pool: z
      .custom<PgPool>(isPool, { message: 'must be a pg.Pool (an object with connect() and end())' })
      .optional(),
    endPoolOnDestroy: z.boolean().optional(),
    schema: z
      .string()
      .regex(SCHEMA_NAME, 'must be a lower-case identifier: a-z, 0-9 and _, not starting with a digit')
      .optional(),
    max: z.number().int().positive().optional(),
    connectionTimeoutMillis: z.number().int().positive().optional(),
    applicationName: z.string().optional(),
    statementTimeoutMillis: z.number().int().nonnegative().optional(),
    preparedStatements: z.boolean().optional(),
  })
  .strict()
  .superRefine((o, ctx) => {
    if (o.connectionString === undefined && o.pool === undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['connectionString'],
        message:
          'give either connectionString (Cairn makes its own pool) or pool (your pg.Pool); neither was given',
      });
    } else if (o.connectionString !== undefined && o.pool !== undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['pool'],
        message: 'give either connectionString or pool, not both',
      });
    }
    if (o.pool !== undefined) {
      for (const k of [
        'max',
        'connectionTimeoutMillis',
        'applicationName',
        'statementTimeoutMillis',
      ] as const) {
        if (o[k] !== undefined) {
          ctx.addIssue({
            code: 'custom',
            path: [k],
            message: 'set it on your pg.Pool: it applies only with connectionString',
          });
        }
      }
    } else if (o.endPoolOnDestroy !== undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['endPoolOnDestroy'],
        message: 'applies only with pool: a pool Cairn makes is always ended by db.destroy()',
      });
    }
  });

/** What both ways of making a database share. */
interface CommonDbOptions {
  /**
   * The Postgres schema of Cairn's tables, functions and migration records (default: the
   * environment's CAIRN_SCHEMA, else `cairn`). `cairn migrate` creates it. A database
   * migrated by Cairn 0.2 has them in `public`: pass `schema: 'public'` for it.
   */
  schema?: string;
  /**
   * Run Cairn's hottest statements (the task CAS) as named prepared statements, parsed and
   * planned once per connection. Default: true on the pool Cairn makes from a connection
   * string; false on the application's pool, whose connections Cairn does not control (a
   * `DISCARD ALL` there would drop a statement pg still counts as prepared). Set false behind
   * a PgBouncer in transaction mode that does not support prepared statements (before 1.21,
   * or max_prepared_statements 0).
   */
  preparedStatements?: boolean;
}

/** Cairn makes and owns a pg pool for this connection string; `db.destroy()` ends it. */
export interface ConnectionStringOptions extends CommonDbOptions {
  connectionString: string;
  /** Connections in the pool (default 10). */
  max?: number;
  /** How long to wait for a connection, in milliseconds (default 5000). */
  connectionTimeoutMillis?: number;
  /** `application_name` of the connections (default "cairn"). */
  applicationName?: string;
  /** `statement_timeout` of the connections in milliseconds (default 0: none). */
  statementTimeoutMillis?: number;
  pool?: never;
}

/**
 * Cairn runs on the application's pg.Pool. The pool is left as it is (its type parsers
 * included: Cairn's queries carry their own), and `db.destroy()` does not end it unless
 * `endPoolOnDestroy` is true. While Cairn holds one of its clients, Cairn's schema is first
 * on that client's search_path; the pool's own path is put back before the client returns.
 */
export interface ExistingPoolOptions extends CommonDbOptions {
  pool: PgPool;
  /** End the pool in `db.destroy()` (default false: the pool stays yours to end). */
  endPoolOnDestroy?: boolean;
  connectionString?: never;
}

/**
 * How createDb connects: a connection string (Cairn makes and owns the pool) or your
 * existing pg.Pool.
 */
export type DbOptions = ConnectionStringOptions | ExistingPoolOptions;
/**
 * Cairn's database handle: a kysely instance over a pg pool, typed with Cairn's tables.
 * `db.destroy()` closes it.
 */
export type Db = Kysely<Database>;

/** Each database's address with the password redacted, for log lines (see databaseAddress). */
const addresses = new WeakMap<Db, string>();

const defaults = {
  max: 10,
  connectionTimeoutMillis: 5000,
  applicationName: 'cairn',
  statementTimeoutMillis: 0,
};

/**
 * Creates a kysely instance over a pg pool: one Cairn makes from `connectionString`, or the
 * application's own `pool`. Call `db.destroy()` to close it (and its tenant views); it ends
 * the application's pool only with `endPoolOnDestroy: true`.
 */
export function createDb(options: DbOptions): Db {
  const o = parseOptions('database options', DbOptionsSchema, options);
  const settings: Omit<PoolSettings, 'connectionString'> & { connectionString?: string } = {
    max: o.max ?? defaults.max,
    connectionTimeoutMillis: o.connectionTimeoutMillis ?? defaults.connectionTimeoutMillis,
    applicationName: o.applicationName ?? defaults.applicationName,
    statementTimeoutMillis: o.statementTimeoutMillis ?? defaults.statementTimeoutMillis,
    connectionString: o.connectionString ?? poolConnectionString(o.pool),
    schema: o.schema ?? defaultSchema(),
    preparedStatements: o.preparedStatements ?? o.pool === undefined,
  };
  const pool = o.pool
    ? callerPool(o.pool, o.endPoolOnDestroy ?? false, settings.schema, settings.preparedStatements)
    : createPool({ ...settings, connectionString: o.connectionString! });
  const driver = new PostgresDialect({ pool }).createDriver();
  const dialect: Dialect = {
    createAdapter: () => new PostgresAdapter(),
    createDriver: () => ({
      init: () => driver.init(),
      acquireConnection: () => driver.acquireConnection(),
      beginTransaction: (c, s) => driver.beginTransaction(c, s),
      commitTransaction: (c) => driver.commitTransaction(c),
      rollbackTransaction: (c) => driver.rollbackTransaction(c),
      releaseConnection: (c) => driver.releaseConnection(c),
      destroy: async () => {
        await destroyTenantViews(db);
        await driver.destroy();
      },
    }),
    createIntrospector: (k) => new PostgresIntrospector(k),
    createQueryCompiler: () => new PostgresQueryCompiler(),
  };
  const db: Db = new Kysely<Database>({ dialect });
  registerPool(db, settings);
  addresses.set(
    db,
    settings.connectionString ? redact(settings.connectionString) : "(the application's pg.Pool)",
  );
  return db;
}

/** A pg.Pool's connection string, when it was made with one (for tenant views and messages). */
function poolConnectionString(pool: PgPool | undefined): string | undefined {
  const s = (pool as { options?: { connectionString?: unknown } } | undefined)?.options?.connectionString;
  return typeof s === 'string' && s ? s : undefined;
}

/**
 * Fails fast with the address tried and what to do, instead of hanging on a dead server: for
 * one-shot commands. Long-running processes wait instead (see startup/untilReachable.ts).
 */
export async function assertReachable(db: Db, connectionString: string): Promise<void> {
  try {
    await db.selectNoFrom((eb) => eb.val(1).as('one')).execute();
  } catch (err) {
    if (isConfigurationSqlError(err)) {
      throw new ConfigurationError(
        `Postgres at ${redact(connectionString)} refused the connection: ${(err as Error).message}. ` +
          'Fix DATABASE_URL (user, password, database name).',
        err,
      );
    }
    throw new UnavailableError(
      `cannot reach Postgres at ${redact(connectionString)}: ${(err as Error).message}. ` +
        'Check that the server runs, or set DATABASE_URL to one that does (see README: "Use your own Postgres and Kafka").',
      err,
    );
  }
}

/** Where `db` connects, password redacted: what a log line names while a process waits for it. */
export function databaseAddress(db: Db): string {
  return addresses.get(db) ?? '(a database not made by createDb)';
}

/** One round trip; throws what pg threw when the server cannot be reached or refuses us. */
export async function pingDatabase(db: Db): Promise<void> {
  await db.selectNoFrom((eb) => eb.val(1).as('one')).execute();
}

/** Throws unless the server takes writes (a standby, or one set read-only, does not). */
export async function pingWritable(db: Db): Promise<void> {
  const { rows } = await sql<{ ro: string }>`SELECT current_setting('transaction_read_only') AS ro`.execute(
    db,
  );
  if (rows[0]?.ro !== 'off')
    throw new UnavailableError('the server is read-only (a standby, or default_transaction_read_only)');
}

export function redact(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '(unparsable connection string)';
  }
}
