import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, symlinkSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, inject, it } from 'vitest';
import { kafkaPaths, repoRoot } from '../../cli/stack/paths.js';
import { resolveStack } from '../../cli/stack/resolve.js';
import { ExitCode } from '../../src/exitCodes.js';
import { cairnBundle } from '../support/cli.js';
import { spawnTs } from '../support/processes.js';
import { createTestDatabase } from '../support/testDatabase.js';

const run = promisify(execFile);

// Port 1 on loopback: nothing listens there, so connections are refused at once.
// One-shot commands fail fast; long-running processes wait (startDuringOutage.int.test.ts).
describe('unreachable services give one-shot commands a clear error, not a hang', () => {
  it('cairn migrate names the Postgres address it tried and what to do', async () => {
    const started = Date.now();
    const result = await run(process.execPath, [cairnBundle(), 'migrate'], {
      cwd: repoRoot,
      env: { ...process.env, DATABASE_URL: 'postgres://cairn:s3cret@127.0.0.1:1/nowhere' },
    }).then(
      () => ({ code: 0, stderr: '' }),
      (err: { code: number; stderr: string }) => err,
    );
    // An outage concluded nothing: EX_TEMPFAIL, run it again (a finding or failure is 1).
    expect(result.code).toBe(ExitCode.unavailable);
    expect(result.stderr).toContain('cannot reach Postgres at postgres://cairn:***@127.0.0.1:1/nowhere');
    expect(result.stderr).toContain('set DATABASE_URL');
    expect(result.stderr).not.toContain('s3cret');
    expect(Date.now() - started).toBeLessThan(30_000);
  });

  it('the stack resolver names the Kafka address it tried and what to do', async () => {
    const saved = { ...process.env };
    process.env.KAFKA_BROKERS = '127.0.0.1:1';
    process.env.CAIRN_STACK = 'local';
    try {
      await expect(resolveStack(() => {})).rejects.toThrow(
        /Kafka did not answer at 127\.0\.0\.1:1 \(from KAFKA_BROKERS\).*unset KAFKA_BROKERS/s,
      );
    } finally {
      process.env = saved;
    }
  });

  it('a local broker that fails to start says so with the last lines of its log', async (ctx) => {
    if (!existsSync(kafkaPaths.libs)) ctx.skip(); // the broker jars exist only where the local stack ran
    const dir = mkdtempSync(join(tmpdir(), 'cairn-stack-'));
    mkdirSync(join(dir, 'kafka'), { recursive: true });
    symlinkSync(kafkaPaths.libs, join(dir, 'kafka', 'libs'));
    // A port this test holds: the broker cannot bind its listener there and exits.
    const taken = createServer();
    await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
    const port = (taken.address() as { port: number }).port;
    const spare = createServer();
    await new Promise<void>((r) => spare.listen(0, '127.0.0.1', r));
    const controllerPort = (spare.address() as { port: number }).port;
    await new Promise((r) => spare.close(r));
    const result = await run(process.execPath, [cairnBundle(), 'stack', 'up'], {
      cwd: repoRoot,
      env: {
        ...process.env,
        CAIRN_STACK_DIR: dir,
        CAIRN_KAFKA_PORT: String(port),
        CAIRN_KAFKA_CONTROLLER_PORT: String(controllerPort),
        KAFKA_BROKERS: '',
      },
      timeout: 120_000,
    })
      .then(
        () => ({ code: 0, stderr: '' }),
        (err: { code: number; stderr: string }) => err,
      )
      .finally(() => taken.close());
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(
      /the Kafka broker (exited|\(pid \d+\) died) .*before it was ready\. Last log lines:/,
    );
    expect(result.stderr).toContain(
      `Socket server failed to bind to 127.0.0.1:${port}: Address already in use`,
    );
  });
});

/** Starts a long-running process and waits for it to exit by itself (it must not wait). */
async function exitOf(entry: string, env: Record<string, string>) {
  const child = spawnTs(entry, entry, { GROUP: 'g', TOPIC: 't', ...env });
  const timer = setTimeout(() => child.proc.kill('SIGKILL'), 30_000);
  const code = await child.exited;
  clearTimeout(timer);
  return { code, output: child.output() };
}

describe('configuration errors end long-running processes at once with exit 78 and the value', () => {
  const kafka = inject('kafkaBrokers');

  it('cairn relay: KAFKA_BROKERS without a port', async () => {
    const r = await exitOf('relay/main.ts', {
      DATABASE_URL: inject('databaseUrl'),
      KAFKA_BROKERS: '127.0.0.1',
    });
    expect(r.code, r.output).toBe(ExitCode.configuration);
    expect(r.output).toContain('KAFKA_BROKERS is not a comma-separated list of host:port: "127.0.0.1"');
  });

  it('cairn relay: a database that does not exist (3D000)', async () => {
    const url = new URL(inject('databaseUrl'));
    url.pathname = '/cairn_no_such_database';
    const r = await exitOf('relay/main.ts', { DATABASE_URL: url.toString(), KAFKA_BROKERS: kafka });
    expect(r.code, r.output).toBe(ExitCode.configuration);
    expect(r.output).toContain(`postgres at ${url.toString()} refused the configuration`);
    expect(r.output).toContain('database "cairn_no_such_database" does not exist');
  });

  it('cairn relay: a database without the Cairn tables says to run cairn migrate', async () => {
    const tdb = await createTestDatabase('unmigrated', { migrate: false, max: 1 });
    try {
      const r = await exitOf('relay/main.ts', { DATABASE_URL: tdb.url, KAFKA_BROKERS: kafka });
      expect(r.code, r.output).toBe(ExitCode.configuration);
      expect(r.output).toContain('run `cairn migrate` first');
    } finally {
      await tdb.drop();
    }
  });

  it('an inbox consumer process: a DATABASE_URL that is not a URL, password masked', async () => {
    const r = await exitOf('test/support/effectConsumer.ts', {
      DATABASE_URL: 'postgres://cairn:s3cret@db.example:port/cairn',
      KAFKA_BROKERS: kafka,
    });
    expect(r.code, r.output).toBe(ExitCode.configuration);
    expect(r.output).toContain(
      'DATABASE_URL is not a postgres:// URL: "postgres://cairn:***@db.example:port/cairn"',
    );
    expect(r.output).not.toContain('s3cret');
  });
});
