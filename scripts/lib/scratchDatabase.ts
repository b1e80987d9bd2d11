import pRetry from 'p-retry';
import pg from 'pg';
import { isConfigurationSqlError } from '../../src/db/sqlstate.js';

export interface ScratchDatabase {
  name: string;
  /** The server's URL with this database in its path. */
  url: string;
  /** Drops it, ending any sessions still connected. */
  drop(): Promise<void>;
}

/**
 * A connection to the server, tried again until `deadlineMs`: a server that does not answer in
 * time (under two CPU hogs and a chaos soak, at a load average of 99, a connection took more
 * than the 5 s each attempt allows: "timeout expired") is an outage, not a failed test. A
 * configuration error (credentials refused) is thrown at once.
 */
async function onServer<T>(
  serverUrl: string,
  fn: (c: pg.Client) => Promise<T>,
  deadlineMs = 120_000,
): Promise<T> {
  const client = await pRetry(
    async () => {
      // A client whose connect failed cannot connect again: a new one each attempt.
      const c = new pg.Client({ connectionString: serverUrl, connectionTimeoutMillis: 5000 });
      c.on('error', () => {}); // a server gone after the connect: the query in flight fails instead
      try {
        await c.connect();
        return c;
      } catch (err) {
        await c.end().catch(() => {});
        throw err;
      }
    },
    {
      retries: Number.POSITIVE_INFINITY,
      maxRetryTime: deadlineMs,
      minTimeout: 200,
      maxTimeout: 2000,
      shouldRetry: ({ error }) => !isConfigurationSqlError(error),
    },
  );
  try {
    return await fn(client);
  } finally {
    await client.end().catch(() => {});
  }
}

/**
 * A database of its own on the server `serverUrl` points at: for a test file, a benchmark
 * run or the demo. `recreate` drops one of the same name first (the demo reuses its name).
 */
export async function createScratchDatabase(
  serverUrl: string,
  name: string,
  opts: { recreate?: boolean } = {},
): Promise<ScratchDatabase> {
  const id = pg.escapeIdentifier(name);
  await onServer(serverUrl, async (c) => {
    if (opts.recreate) await c.query(`DROP DATABASE IF EXISTS ${id} WITH (FORCE)`);
    await c.query(`CREATE DATABASE ${id} TEMPLATE template0`);
  });
  const u = new URL(serverUrl);
  u.pathname = `/${name}`;
  return { name, url: u.toString(), drop: () => dropScratchDatabase(serverUrl, name) };
}

/** Drops the database `name` if it exists, ending any sessions still connected to it. */
export async function dropScratchDatabase(serverUrl: string, name: string): Promise<void> {
  const id = pg.escapeIdentifier(name);
  await onServer(serverUrl, (c) => c.query(`DROP DATABASE IF EXISTS ${id} WITH (FORCE)`));
}
