import { createServer, type Server } from 'node:http';
import type { Registry } from 'prom-client';

export interface MetricsServer {
  port: number;
  close(): Promise<void>;
}

/**
 * `/metrics` (Prometheus text format), `/healthz` (the process answers) and `/readyz` (it
 * does its job: for the relay, it owns lanes and its last iteration succeeded).
 */
export async function startMetricsServer(opts: {
  registry: Registry;
  port: number;
  host?: string;
  ready: () => boolean | Promise<boolean>;
}): Promise<MetricsServer> {
  const server: Server = createServer(async (req, res) => {
    try {
      if (req.url === '/metrics') {
        res.writeHead(200, { 'content-type': opts.registry.contentType }).end(await opts.registry.metrics());
      } else if (req.url === '/healthz') {
        res.writeHead(200).end('ok\n');
      } else if (req.url === '/readyz') {
        const ok = await opts.ready();
        res.writeHead(ok ? 200 : 503).end(ok ? 'ready\n' : 'not ready\n');
      } else {
        res.writeHead(404).end();
      }
    } catch (err) {
      res.writeHead(500).end(`${(err as Error).message}\n`);
    }
  });
  await new Promise<void>((resolve) => server.listen(opts.port, opts.host ?? '127.0.0.1', resolve));
  return {
    port: (server.address() as { port: number }).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
