import pg from 'pg';

export interface ScratchDatabase {
  name: string;
  /** The server's URL with this database in its path. */
  url: string;
  /** Drops it, ending any sessions still connected. */
  drop(): Promise<void>;
}

async function onServer<T>(serverUrl: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: serverUrl, connectionTimeoutMillis: 5000 });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
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
  return {
    name,
    url: u.toString(),
    drop: () =>
      onServer(serverUrl, (c) => c.query(`DROP DATABASE IF EXISTS ${id} WITH (FORCE)`)).then(() => {}),
  };
}
