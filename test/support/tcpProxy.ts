import { createConnection, createServer, type Socket } from 'node:net';
import { createDb, type Db } from '../../src/db/database.js';

/** A loopback port nothing listens on (yet): connections to it are refused at once. */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as { port: number };
  await new Promise((r) => server.close(r));
  return port;
}

export interface TcpProxy {
  close(): Promise<void>;
  /**
   * The dependency goes down: every open connection is cut and each new one is closed as soon
   * as it is accepted, until restore(). `onRefused(n)` is called with the count refused so far.
   */
  cut(onRefused?: (n: number) => void): void;
  restore(): void;
}

/**
 * Listens on 127.0.0.1:`port` and forwards every connection to `target`: a dependency that
 * "comes back" at an address a process was started with, while the real server keeps serving
 * everyone else.
 */
export async function startTcpProxy(port: number, target: { host: string; port: number }): Promise<TcpProxy> {
  const sockets = new Set<Socket>();
  let down: { refused: number; onRefused?: ((n: number) => void) | undefined } | undefined;
  const server = createServer((client) => {
    if (down) {
      client.destroy();
      down.onRefused?.(++down.refused);
      return;
    }
    const upstream = createConnection(target);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', resolve);
  });
  return {
    cut(onRefused) {
      down = { refused: 0, onRefused };
      for (const s of sockets) s.destroy();
    },
    restore() {
      down = undefined;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/**
 * A pool on the database at `url` through a proxy the test can cut (Postgres "going away" for
 * this pool only). Close with `close()`: the pool, then the proxy.
 */
export async function dbBehindProxy(
  url: string,
): Promise<{ db: Db; proxy: TcpProxy; close(): Promise<void> }> {
  const port = await freePort();
  const real = new URL(url);
  const proxy = await startTcpProxy(port, { host: real.hostname, port: Number(real.port || 5432) });
  const via = new URL(url);
  via.host = `127.0.0.1:${port}`;
  const db = createDb({ connectionString: via.toString(), max: 4 });
  return {
    db,
    proxy,
    async close() {
      await db.destroy();
      await proxy.close();
    },
  };
}
