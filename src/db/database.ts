import {
  type Dialect,
  Kysely,
  PostgresAdapter,
  PostgresDialect,
  PostgresIntrospector,
  PostgresQueryCompiler,
} from 'kysely';
import pg from 'pg';
import { z } from 'zod';
import { ConfigurationError, UnavailableError } from '../errors.js';
import { parseOptions } from '../options.js';
import { isConfigurationSqlError } from './sqlstate.js';
import { destroyTenantViews, registerPool } from './tenant.js';
import type { Database } from './types.js';

// int8 (bigint) columns such as versions, ids and fencing tokens stay far below 2^53 in
// practice; parse them as numbers so callers compare versions with plain ===.
pg.types.setTypeParser(pg.types.builtins.INT8, (v) => Number(v));

const DbOptions = z
  .object({
    connectionString: z.string().min(1),
    max: z.number().int().positive().default(10),
    connectionTimeoutMillis: z.number().int().positive().default(5000),
    applicationName: z.string().default('cairn'),
    statementTimeoutMillis: z.number().int().nonnegative().default(0),
  })
  .strict();

export type DbOptions = z.input<typeof DbOptions>;
export type PoolSettings = z.output<typeof DbOptions>;
export type Db = Kysely<Database>;

/** Each database's address with the password redacted, for log lines (see databaseAddress). */
const addresses = new WeakMap<Db, string>();

/** Creates a kysely instance over a pg pool. Call `db.destroy()` to close it (and its tenant views). */
export function createDb(options: DbOptions): Db {
  const o = parseOptions('database options', DbOptions, options);
  const pool = createPool(o);
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
  registerPool(db, o);
  addresses.set(db, redact(o.connectionString));
  return db;
}

/** A pg pool with Cairn's settings and error listeners. */
export function createPool(o: PoolSettings): pg.Pool {
  const pool = new pg.Pool({
    connectionString: o.connectionString,
    max: o.max,
    connectionTimeoutMillis: o.connectionTimeoutMillis,
    application_name: o.applicationName,
    ...(o.statementTimeoutMillis ? { statement_timeout: o.statementTimeoutMillis } : {}),
  });
  // An idle client whose backend is killed emits 'error' on the pool; without a listener
  // that would crash the process. The next query simply gets a fresh connection.
  pool.on('error', () => {});
  // A checked-out client whose server dies between two queries (a transaction in progress
  // when the primary crashes) emits 'error' with no pool listener attached: the next query
  // on it fails and the pool drops it; without this listener the process would crash.
  pool.on('connect', (client) => client.on('error', () => {}));
  return pool;
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

export function redact(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '(unparsable connection string)';
  }
}
