import pg from 'pg';

/**
 * A real pg.Pool whose clients hand back the answer of a query matching `match` only once
 * `gate(text)` resolves: a named point where a test holds an actor after Postgres answered,
 * as a GC pause or SIGSTOP would. Postgres itself is untouched.
 */
export function slowPool(url: string, gate: (text: string) => Promise<void> | undefined): pg.Pool {
  const pool = new pg.Pool({ connectionString: url, max: 4 });
  const patched = new WeakSet<object>();
  const connect = pool.connect.bind(pool) as () => Promise<pg.PoolClient>;
  (pool as unknown as { connect: () => Promise<pg.PoolClient> }).connect = async () => {
    const client = await connect();
    if (!patched.has(client)) {
      patched.add(client);
      const query = client.query.bind(client) as (...a: unknown[]) => Promise<unknown>;
      (client as unknown as { query: (...a: unknown[]) => unknown }).query = (...args: unknown[]) => {
        const text = typeof args[0] === 'string' ? args[0] : ((args[0] as { text?: string })?.text ?? '');
        const p = query(...args);
        if (typeof (p as Promise<unknown>)?.then !== 'function') return p;
        return (p as Promise<unknown>).then(async (r) => {
          await gate(text);
          return r;
        });
      };
    }
    return client;
  };
  return pool;
}
