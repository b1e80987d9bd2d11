import { createServer, type Server } from 'node:http';

/**
 * A stand-in for an external API with idempotency keys, on 127.0.0.1: it counts every call
 * per operation and per key, applies an effect only for a key it has not seen, and records
 * compensations. Tests read it to prove what happened outside the database.
 */
export interface Sink {
  url: string;
  /** operation -> idempotency keys it was called with (more than one would mean a double effect). */
  keysByOperation: Map<string, Set<string>>;
  calls: number;
  applied: Map<string, number>; // idempotency key -> effects applied (the sink dedupes: at most 1)
  compensated: Set<string>;
  close(): Promise<void>;
}

export async function startSink(): Promise<Sink> {
  const sink = {
    keysByOperation: new Map<string, Set<string>>(),
    calls: 0,
    applied: new Map<string, number>(),
    compensated: new Set<string>(),
  };
  const server: Server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://127.0.0.1');
    const key = req.headers['idempotency-key'];
    const op = url.searchParams.get('op') ?? '';
    if (typeof key !== 'string' || !op) {
      res.writeHead(400).end('idempotency-key header and op are required');
      return;
    }
    sink.calls++;
    if (url.pathname === '/apply') {
      const keys = sink.keysByOperation.get(op) ?? new Set<string>();
      keys.add(key);
      sink.keysByOperation.set(op, keys);
      if (!sink.applied.has(key)) sink.applied.set(key, 1);
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ deployed: op, key }));
    } else if (url.pathname === '/compensate') {
      sink.compensated.add(key);
      res.writeHead(200).end('{}');
    } else {
      res.writeHead(404).end();
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address() as { port: number };
  return {
    ...sink,
    get calls() {
      return sink.calls;
    },
    url: `http://127.0.0.1:${address.port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

export async function callSink(
  url: string,
  path: '/apply' | '/compensate',
  op: string,
  key: string,
): Promise<unknown> {
  const res = await fetch(`${url}${path}?op=${encodeURIComponent(op)}`, {
    method: 'POST',
    headers: { 'idempotency-key': key },
  });
  if (!res.ok) throw new Error(`sink answered ${res.status}`);
  return res.json();
}
