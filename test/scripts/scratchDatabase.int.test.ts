import { randomBytes } from 'node:crypto';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import pg from 'pg';
import { afterEach, describe, expect, inject, it } from 'vitest';
import { createScratchDatabase } from '../../scripts/lib/scratchDatabase.js';

/**
 * A Postgres that drops the first `drop` connections it accepts (a server too busy to answer:
 * the client sees its connection end) and forwards every later one to the real server.
 */
async function flakyPostgres(drop: number) {
  const real = new URL(inject('databaseUrl'));
  const sockets = new Set<Socket>();
  let accepted = 0;
  const server: Server = createServer((client) => {
    sockets.add(client);
    client.on('close', () => sockets.delete(client));
    if (++accepted <= drop) {
      client.destroy();
      return;
    }
    const upstream = createConnection({ host: real.hostname, port: Number(real.port || 5432) });
    sockets.add(upstream);
    upstream.on('close', () => sockets.delete(upstream));
    const both = [client, upstream];
    for (const s of both) {
      s.on('error', () => {
        for (const x of both) x.destroy();
      });
    }
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = new URL(real);
  url.host = `127.0.0.1:${(server.address() as { port: number }).port}`;
  return {
    url: url.toString(),
    accepted: () => accepted,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

async function exists(name: string): Promise<boolean> {
  const c = new pg.Client({ connectionString: inject('databaseUrl') });
  await c.connect();
  try {
    return (await c.query('SELECT 1 FROM pg_database WHERE datname = $1', [name])).rowCount === 1;
  } finally {
    await c.end();
  }
}

describe('scratch databases when the server does not answer at once', () => {
  let close: (() => Promise<void>) | undefined;
  afterEach(async () => {
    await close?.();
    close = undefined;
  });

  it('connections that end before the server answered are tried again: the database is created and dropped', async () => {
    const pgServer = await flakyPostgres(2);
    close = pgServer.close;
    const name = `cairn_t_scratch_${randomBytes(4).toString('hex')}`;
    const scratch = await createScratchDatabase(pgServer.url, name);
    expect(pgServer.accepted()).toBe(3); // two dropped, the third answered
    expect(await exists(name)).toBe(true);
    await scratch.drop();
    expect(await exists(name)).toBe(false);
  });

  it('a configuration error (a database that does not exist in the server URL) is thrown at once', async () => {
    const pgServer = await flakyPostgres(0);
    close = pgServer.close;
    const url = new URL(pgServer.url);
    url.pathname = `/cairn_t_missing_${randomBytes(4).toString('hex')}`;
    await expect(createScratchDatabase(url.toString(), 'cairn_t_never')).rejects.toMatchObject({
      code: '3D000',
    });
    expect(pgServer.accepted()).toBe(1);
  });
});
