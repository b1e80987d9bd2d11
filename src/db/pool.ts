import { createHash } from 'node:crypto';
import type { PostgresCursor, PostgresPool, PostgresPoolClient, PostgresQueryResult } from 'kysely';
import pg from 'pg';
import { ConfigurationError } from '../errors.js';
import { SqlState } from './sqlstate.js';

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
  /** Cairn's Postgres schema: first on every connection's search_path (see {@link searchPath}). */
  schema: string;
  /** Run statements marked {@link PREPARED} as named prepared statements. */
  preparedStatements: boolean;
}

/**
 * The comment a hot statement starts with to run as a named prepared statement: Postgres then
 * parses, rewrites and plans it once per connection instead of on every execution. kysely
 * passes no statement name to pg, so the pool's clients recognise the mark. Off with
 * `preparedStatements: false` (a PgBouncer in transaction mode without prepared statement
 * support), when the comment is just a comment.
 */
export const PREPARED = '/* cairn-prepared */';

const preparedNames = new Map<string, string>();

/** A marked text's statement name: one per text (a handful, all Cairn's), the same on every connection. */
function preparedName(text: string): string {
  let name = preparedNames.get(text);
  if (name === undefined) {
    name = `cairn_${createHash('sha256').update(text).digest('hex').slice(0, 24)}`;
    preparedNames.set(text, name);
  }
  return name;
}

/** pg's query config for a text: named when it is marked and the pool prepares. */
function queryConfig(text: string, values: unknown[], prepared: boolean) {
  return prepared && text.startsWith(PREPARED)
    ? { name: preparedName(text), text, values }
    : { text, values };
}

/**
 * Runs a named query and, when the server says the statement is not prepared (someone ran
 * `DEALLOCATE ALL` or `DISCARD ALL` on the connection, say an inbox handler on its
 * transaction), makes pg forget it had prepared it: pg would otherwise only Bind it by name on
 * that connection from then on, and fail the same way for good. The next run parses it again.
 * The error itself goes on to the caller (see casUpdate for when it is run again).
 */
function forgettingGone<T>(client: unknown, name: string | undefined, result: Promise<T>): Promise<T> {
  if (name === undefined) return result;
  return result.catch((error: unknown) => {
    // Only the server saying this statement is not prepared: a 26000 raised from inside it (a
    // trigger, a function) leaves it prepared, and forgetting it then would make the next run
    // Parse it again and fail with 42P05 ("already exists") on that connection for good.
    const e = error as { code?: unknown; message?: unknown };
    if (
      e.code === SqlState.invalidSqlStatementName &&
      String(e.message).includes(`"${name}" does not exist`)
    ) {
      const parsed = (client as { connection?: { parsedStatements?: Record<string, unknown> } }).connection
        ?.parsedStatements;
      if (parsed) delete parsed[name];
    }
    throw error;
  });
}

/**
 * Makes a pg client of a Cairn pool run marked statements prepared: kysely calls
 * `query(text, values)`; a marked text goes on as `{ name, text, values }`. The method is
 * looked up on the prototype at each call, so whatever wraps pg's Client.query still sees it.
 */
function prepareMarked(client: { query: (...args: unknown[]) => unknown }): void {
  const proto = Object.getPrototypeOf(client) as { query: (...args: unknown[]) => unknown };
  client.query = function (this: unknown, config: unknown, values?: unknown, callback?: unknown) {
    if (
      typeof config === 'string' &&
      config.startsWith(PREPARED) &&
      Array.isArray(values) &&
      callback === undefined
    ) {
      const named = queryConfig(config, values, true);
      return forgettingGone(this, named.name, proto.query.call(this, named) as Promise<unknown>);
    }
    return proto.query.call(this, config, values, callback);
  };
}

/** A schema name Cairn accepts: a plain lower-case identifier, so it never needs quoting. */
export const SCHEMA_NAME = /^[a-z_][a-z0-9_]{0,62}$/;

/** The schema of Cairn's tables when none is given: CAIRN_SCHEMA, else `cairn`. */
export function defaultSchema(): string {
  const fromEnv = process.env.CAIRN_SCHEMA;
  if (fromEnv === undefined || fromEnv === '') return 'cairn';
  if (!SCHEMA_NAME.test(fromEnv)) {
    throw new ConfigurationError(
      `CAIRN_SCHEMA is not a schema name Cairn accepts: "${fromEnv}" ` +
        '(a lower-case identifier: a-z, 0-9 and _, not starting with a digit).',
    );
  }
  return fromEnv;
}

/**
 * The search_path of Cairn's connections: its own schema first, so its unqualified table
 * names find its tables, then `public`, where an inbox handler's own tables usually live.
 */
export function searchPath(schema: string): string {
  return schema === 'public' ? 'public' : `${schema}, public`;
}

/** The libpq `options` that start a connection with Cairn's search_path (no round trip of its own). */
export function searchPathOption(schema: string): string {
  return `-c search_path=${searchPath(schema).replace(' ', '')}`;
}

/**
 * A connection string without its own `options` parameter, and the options to pass beside
 * it: the string's (e.g. `-c statement_timeout=...`, a provider's `endpoint=...`) followed by
 * Cairn's search_path. pg lets the string's parameters win over the pool's settings, so
 * leaving `options` in it would silently drop Cairn's.
 */
export function withSearchPath(
  connectionString: string,
  schema: string,
): { connectionString: string; options: string } {
  let url: URL;
  try {
    url = new URL(connectionString);
  } catch {
    return { connectionString, options: searchPathOption(schema) };
  }
  const own = url.searchParams.get('options');
  if (own === null) return { connectionString, options: searchPathOption(schema) };
  url.searchParams.delete('options');
  // The later -c of the same setting wins: Cairn's search_path, after whatever the string set.
  return { connectionString: url.toString(), options: `${own} ${searchPathOption(schema)}` };
}

/**
 * A pg pool with Cairn's settings, type parsers and error listeners. Typed as kysely sees a
 * pool, so that Cairn's declarations never name pg's types (the application's tsc would then
 * need @types/pg).
 */
export function createPool(o: PoolSettings): PostgresPool {
  const { connectionString, options } = withSearchPath(o.connectionString, o.schema);
  const pool = new pg.Pool({
    connectionString,
    max: o.max,
    connectionTimeoutMillis: o.connectionTimeoutMillis,
    application_name: o.applicationName,
    types: cairnTypes,
    options,
    ...(o.statementTimeoutMillis ? { statement_timeout: o.statementTimeoutMillis } : {}),
  });
  // An idle client whose backend is killed emits 'error' on the pool; without a listener
  // that would crash the process. The next query simply gets a fresh connection.
  pool.on('error', () => {});
  // A checked-out client whose server dies between two queries (a transaction in progress
  // when the primary crashes) emits 'error' with no pool listener attached: the next query
  // on it fails and the pool drops it; without this listener the process would crash.
  pool.on('connect', (client) => {
    client.on('error', () => {});
    if (o.preparedStatements) prepareMarked(client as unknown as Parameters<typeof prepareMarked>[0]);
  });
  return pool;
}

/**
 * What Cairn needs of the application's pool; a `pg.Pool` is one. Declared here rather than
 * taken from @types/pg so that Cairn's declarations need nothing Cairn does not ship.
 */
export interface PgPool {
  /** Checks a client out of the pool. */
  connect(): Promise<PgPoolClient>;
  /** Ends the pool (only called with `endPoolOnDestroy: true`). */
  end(): Promise<void>;
}

/** What Cairn needs of a client checked out of a {@link PgPool}; a `pg.PoolClient` is one. */
export interface PgPoolClient {
  /** Runs one query; Cairn passes its own type parsers in `types`. */
  query(config: {
    text: string;
    values?: unknown[];
    types?: TypeParsers;
  }): Promise<{ command: string; rowCount: number | null; rows: unknown[] }>;
  /** Returns the client to the pool (or destroys it). */
  release(destroy?: boolean): void;
  /** Listens for the error a backend dying under a checked-out client raises. */
  on(event: 'error', listener: (err: Error) => void): unknown;
}

/**
 * The application's pool as kysely's driver sees it. The pool's own type parsers are left
 * alone (they were fixed when the application built it): each of Cairn's queries carries
 * Cairn's parsers instead. `end()` ends the pool only when `endPool` is set: by default the
 * pool stays the application's to close.
 *
 * Cairn's schema goes first on the search_path of a client while Cairn holds it (one round
 * trip when it is checked out), and the application's own path is put back before the client
 * returns to the pool (a second round trip, saved when the path already started with Cairn's
 * schema, as on a pool made with `options: '-c search_path=cairn,public'`).
 */
export function callerPool(
  pool: PgPool,
  endPool: boolean,
  schema: string,
  preparedStatements: boolean,
): PostgresPool {
  const wrapped = new WeakMap<PgPoolClient, PostgresPoolClient>();
  /** The application's search_path of each client Cairn changed, put back when it is released. */
  const previousPath = new Map<PgPoolClient, string>();
  const release = (client: PgPoolClient, destroy?: boolean) => {
    const previous = previousPath.get(client);
    previousPath.delete(client);
    if (previous === undefined || destroy) return client.release(destroy);
    client.query({ text: "SELECT set_config('search_path', $1, false)", values: [previous] }).then(
      () => client.release(),
      () => client.release(true),
    );
  };
  return {
    async connect() {
      const client = await pool.connect();
      let w = wrapped.get(client);
      if (!w) {
        // See createPool: a backend dying under a checked-out client must fail the next
        // query, not crash the process.
        client.on('error', () => {});
        w = wrapClient(client, (destroy) => release(client, destroy), preparedStatements);
        wrapped.set(client, w);
      }
      try {
        // One round trip on every checkout (the application may have changed the path since
        // the last one): Cairn's schema goes first, unless it already is.
        const { rows } = await client.query({
          text: `SELECT p.previous, p.first = $1 AS ours,
                   CASE WHEN p.first = $1 THEN p.previous
                        ELSE set_config('search_path', $1 || ', ' || p.previous, false) END AS now
                 FROM (SELECT current_setting('search_path') AS previous,
                              btrim(split_part(current_setting('search_path'), ',', 1), ' "') AS first) p`,
          values: [schema],
        });
        const r = rows[0] as { previous: string; ours: boolean };
        if (!r.ours) previousPath.set(client, r.previous);
      } catch (error) {
        client.release(true);
        throw error;
      }
      return w;
    },
    end: () => (endPool ? pool.end() : Promise.resolve()),
  };
}

function wrapClient(
  client: PgPoolClient,
  release: (destroy?: boolean) => void,
  preparedStatements: boolean,
): PostgresPoolClient {
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
    const config = queryConfig(sqlOrCursor, [...(parameters ?? [])], preparedStatements);
    return forgettingGone(
      client,
      'name' in config ? config.name : undefined,
      client.query({ ...config, types: cairnTypes }) as Promise<PostgresQueryResult<R>>,
    );
  }
  return { query, release };
}
