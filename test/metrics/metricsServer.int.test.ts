import { execFile } from 'node:child_process';
import { createServer, type Server } from 'node:net';
import { promisify } from 'node:util';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { ConfigurationError } from '../../src/errors.js';
import { ExitCode } from '../../src/exitCodes.js';
import { metricsAddressFromEnv, startMetricsServer } from '../../src/metrics/metricsServer.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase } from '../support/testDatabase.js';

const exec = promisify(execFile);
let t: TestDatabase;
let squatter: Server;
let takenPort: number;

beforeAll(async () => {
  t = await createTestDatabase('metrics_server');
  // Another process's socket on the port the relay is told to use.
  squatter = createServer();
  await new Promise<void>((resolve) => squatter.listen(0, '127.0.0.1', resolve));
  takenPort = (squatter.address() as { port: number }).port;
});
afterAll(async () => {
  await new Promise<void>((resolve) => squatter?.close(() => resolve()));
  await t?.drop();
});

const ready = () => true;

describe('metrics server', () => {
  it('refuses a taken port with a ConfigurationError naming host:port and CAIRN_METRICS_PORT', async () => {
    const err = await startMetricsServer({ registry: new Registry(), port: takenPort, ready }).catch(
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(ConfigurationError);
    expect(err).toMatchObject({ code: 'configuration', retriable: false });
    expect((err as Error).message).toMatch(
      new RegExp(
        `cannot listen on 127\\.0\\.0\\.1:${takenPort}: the port is already in use \\(EADDRINUSE\\).*CAIRN_METRICS_PORT`,
      ),
    );
  });

  it('binds the host CAIRN_METRICS_HOST names (default 127.0.0.1) and answers there', async () => {
    const env = { ...process.env };
    try {
      process.env.CAIRN_METRICS_PORT = '0';
      delete process.env.CAIRN_METRICS_HOST;
      expect(metricsAddressFromEnv()).toEqual({ host: '127.0.0.1', port: 0 });
      process.env.CAIRN_METRICS_HOST = '0.0.0.0';
      const address = metricsAddressFromEnv()!;
      expect(address).toEqual({ host: '0.0.0.0', port: 0 });
      const server = await startMetricsServer({ registry: new Registry(), ...address, ready });
      try {
        expect(server.host).toBe('0.0.0.0');
        const r = await fetch(`http://127.0.0.1:${server.port}/healthz`);
        expect(r.status).toBe(200);
      } finally {
        await server.close();
      }
      process.env.CAIRN_METRICS_PORT = '80a';
      expect(() => metricsAddressFromEnv()).toThrow(/CAIRN_METRICS_PORT is not a port number: "80a"/);
      delete process.env.CAIRN_METRICS_PORT;
      expect(metricsAddressFromEnv()).toBeUndefined();
    } finally {
      process.env = env;
    }
  });

  it('cairn relay on a taken metrics port exits 78 (configuration) and says which address and variable', async () => {
    const r = await exec(process.execPath, ['--import', 'tsx', 'cli/main.ts', 'relay'], {
      cwd: repoRoot,
      timeout: 90_000,
      env: {
        ...process.env,
        DATABASE_URL: t.url,
        KAFKA_BROKERS: kafkaBrokers().join(','),
        CAIRN_METRICS_PORT: String(takenPort),
        CAIRN_METRICS_HOST: '127.0.0.1',
      },
    }).then(
      () => ({ code: 0, err: '' }),
      (e: { code: number; stderr: string }) => ({ code: e.code, err: e.stderr }),
    );
    expect(r.code).toBe(ExitCode.configuration);
    expect(r.err).toMatch(
      new RegExp(
        `\\[configuration\\] metrics server cannot listen on 127\\.0\\.0\\.1:${takenPort}: .*CAIRN_METRICS_PORT`,
      ),
    );
  });
});
