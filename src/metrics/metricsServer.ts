import { createServer, type Server } from 'node:http';
import type { Registry } from 'prom-client';
import { ConfigurationError } from '../errors.js';

export interface MetricsServer {
  host: string;
  port: number;
  close(): Promise<void>;
}

export interface MetricsServerOptions {
  registry: Registry;
  port: number;
  /** The address to bind; 127.0.0.1 unless set (0.0.0.0 or :: for every interface). */
  host?: string;
  ready: () => boolean | Promise<boolean>;
}

/**
 * `/metrics` (Prometheus text format), `/healthz` (the process answers) and `/readyz` (it
 * does its job: for the relay, it owns lanes and its last iteration succeeded).
 *
 * An address it cannot bind (the port taken, a host that is not this machine's, a
 * privileged port) is a ConfigurationError naming host:port and the variables to change:
 * retrying would fail the same way, so the process exits 78 instead of serving no metrics.
 */
export async function startMetricsServer(opts: MetricsServerOptions): Promise<MetricsServer> {
  const host = opts.host ?? '127.0.0.1';
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
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) => reject(listenError(host, opts.port, err)));
    server.listen(opts.port, host, () => resolve());
  });
  return {
    host,
    port: (server.address() as { port: number }).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

function listenError(host: string, port: number, err: NodeJS.ErrnoException): ConfigurationError {
  const where = `${host.includes(':') ? `[${host}]` : host}:${port}`;
  const why =
    err.code === 'EADDRINUSE'
      ? 'the port is already in use (EADDRINUSE): another process listens there. Set CAIRN_METRICS_PORT to a free port (0 picks one), or stop that process'
      : err.code === 'EADDRNOTAVAIL' || err.code === 'ENOTFOUND'
        ? `${host} is not an address of this machine (${err.code}). Set CAIRN_METRICS_HOST to one of its addresses, 127.0.0.1 or 0.0.0.0`
        : err.code === 'EACCES'
          ? `not permitted (EACCES): ports below 1024 need privileges. Set CAIRN_METRICS_PORT to 1024 or above`
          : `${err.message}. Check CAIRN_METRICS_HOST and CAIRN_METRICS_PORT`;
  return new ConfigurationError(`metrics server cannot listen on ${where}: ${why}`, err);
}

/**
 * CAIRN_METRICS_PORT (unset: no metrics server) and CAIRN_METRICS_HOST (default 127.0.0.1),
 * checked: a port that is not an integer 0-65535 is a ConfigurationError naming it.
 */
export function metricsAddressFromEnv(): { host: string; port: number } | undefined {
  const raw = process.env.CAIRN_METRICS_PORT;
  if (raw === undefined || raw === '') return undefined;
  const port = Number(raw);
  if (!/^\d{1,5}$/.test(raw) || port > 65535) {
    throw new ConfigurationError(
      `CAIRN_METRICS_PORT is not a port number: "${raw}". Set it to an integer from 0 to 65535 (0 picks a free port), or unset it to serve no metrics.`,
    );
  }
  const host = process.env.CAIRN_METRICS_HOST?.trim() || '127.0.0.1';
  return { host, port };
}
