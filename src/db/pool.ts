import type { PostgresCursor, PostgresPool, PostgresPoolClient, PostgresQueryResult } from 'kysely';
import pg from 'pg';

/** pg's hook for turning a column's text into a value: a pool's `types` option, or one query's. */
export interface TypeParsers {
  getTypeParser(oid: number, format?: 'text' | 'binary'): (value: string) => unknown;
}

/**
 * int8 (bigint) columns such as versions, ids and fencing tokens stay far below 2^53 in
 * practice; Cairn reads them as numbers so callers compare versions with plain ===. Only on
 * Cairn's own pools and queries: pg's global parsers (`pg.types`) are the application's.
 * Every other type falls through to the global parsers, so the application's own settings
 * still apply to them.
 */
export const cairnTypes: TypeParsers = {
  getTypeParser(oid, format = 'text') {
    if (oid === pg.types.builtins.INT8 && format === 'text') return (v: string) => Number(v);
    return pg.types.getTypeParser(oid, format) as (value: string) => unknown;
  },
};

/** Where a createDb database connects, without the password: for error messages and log lines. */
export interface PoolSettings {
  connectionString: string;
  max: number;
  connectionTimeoutMillis: number;
  applicationName: string;
  statementTimeoutMillis: number;
}

/**
 * A pg pool with Cairn's settings, type parsers and error listeners. Typed as kysely sees a
 * pool, so that Cairn's declarations never name pg's types (the application's tsc would then
 * need @types/pg).
 */
export function createPool(o: PoolSettings): PostgresPool {
  const pool = new pg.Pool({
    connectionString: o.connectionString,
    max: o.max,
    connectionTimeoutMillis: o.connectionTimeoutMillis,
    application_name: o.applicationName,
    types: cairnTypes,
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
 * What Cairn needs of the application's pool; a `pg.Pool` is one. Declared here rather than
 * taken from @types/pg so that Cairn's declarations need nothing Cairn does not ship.
 */
export interface PgPool {
  connect(): Promise<PgPoolClient>;
  end(): Promise<void>;
}

/** What Cairn needs of a client checked out of a {@link PgPool}; a `pg.PoolClient` is one. */
export interface PgPoolClient {
  query(config: {
    text: string;
    values?: unknown[];
    types?: TypeParsers;
  }): Promise<{ command: string; rowCount: number | null; rows: unknown[] }>;
  release(destroy?: boolean): void;
  on(event: 'error', listener: (err: Error) => void): unknown;
}

/**
 * The application's pool as kysely's driver sees it. The pool's own type parsers are left
 * alone (they were fixed when the application built it): each of Cairn's queries carries
 * Cairn's parsers instead. `end()` ends the pool only when `endPool` is set: by default the
 * pool stays the application's to close.
 */
export function callerPool(pool: PgPool, endPool: boolean): PostgresPool {
  const wrapped = new WeakMap<PgPoolClient, PostgresPoolClient>();
  return {
    async connect() {
      const client = await pool.connect();
      let w = wrapped.get(client);
      if (!w) {
        // See createPool: a backend dying under a checked-out client must fail the next
        // query, not crash the process.
        client.on('error', () => {});
        w = wrapClient(client);
        wrapped.set(client, w);
      }
      return w;
    },
    end: () => (endPool ? pool.end() : Promise.resolve()),
  };
}

function wrapClient(client: PgPoolClient): PostgresPoolClient {
  function query<R>(sql: string, parameters: ReadonlyArray<unknown>): Promise<PostgresQueryResult<R>>;
  function query<R>(cursor: PostgresCursor<R>): PostgresCursor<R>;
  function query<R>(
    sqlOrCursor: string | PostgresCursor<R>,
    parameters?: ReadonlyArray<unknown>,
  ): Promise<PostgresQueryResult<R>> | PostgresCursor<R> {
    if (typeof sqlOrCursor !== 'string') {
      // Cairn configures no cursor; kysely only streams through one when the dialect has it.
      throw new TypeError('Cairn does not stream query results through a cursor');
    }
    return client.query({ text: sqlOrCursor, values: [...(parameters ?? [])], types: cairnTypes }) as Promise<
      PostgresQueryResult<R>
    >;
  }
  return { query, release: (destroy?: boolean) => client.release(destroy) };
}
