import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, inject, it } from 'vitest';
import type { StackStatus } from '../../cli/stack/commands.js';
import { readPid } from '../../cli/stack/kafka.js';
import { repoRoot } from '../../cli/stack/paths.js';

const exec = promisify(execFile);

/** `cairn stack status --json` from source, with `env` over this process's environment. */
async function status(env: Record<string, string | undefined>): Promise<{ code: number; data: StackStatus }> {
  const r = await exec(process.execPath, ['--import', 'tsx', 'cli/main.ts', 'stack', 'status', '--json'], {
    cwd: repoRoot,
    env: { ...process.env, DATABASE_URL: inject('databaseUrl'), ...env },
  }).then(
    (ok) => ({ code: 0, stdout: ok.stdout, stderr: ok.stderr }),
    (e: { code: number; stdout: string; stderr: string }) => e,
  );
  expect(r.stderr).toBe('');
  return { code: r.code, data: JSON.parse(r.stdout) as StackStatus };
}

describe('cairn stack status --json', () => {
  it('asks each broker of KAFKA_BROKERS on its own: one that does not answer is named, ok false, exit 1', async () => {
    const good = inject('kafkaBrokers').split(',')[0]!;
    const r = await status({ KAFKA_BROKERS: `${good},127.0.0.1:1` });
    expect(r.code).toBe(1);
    expect(r.data).toEqual({
      ok: false,
      postgres: { url: expect.any(String), source: 'DATABASE_URL', reachable: true },
      kafka: {
        source: 'KAFKA_BROKERS',
        brokers: [
          { address: good, reachable: true },
          { address: '127.0.0.1:1', reachable: false },
        ],
        pid: null,
      },
    });
  });

  it('Postgres that does not answer: reachable false with the reason, the password redacted, exit 1', async () => {
    const r = await status({
      DATABASE_URL: 'postgres://cairn:s3cret@127.0.0.1:1/none',
      KAFKA_BROKERS: inject('kafkaBrokers'),
    });
    expect(r.code).toBe(1);
    expect(r.data.ok).toBe(false);
    expect(r.data.postgres).toMatchObject({
      source: 'DATABASE_URL',
      reachable: false,
      error: expect.any(String),
    });
    expect(JSON.stringify(r.data)).not.toContain('s3cret');
    expect(r.data.kafka.brokers.every((b) => b.reachable)).toBe(true);
  });

  it("the local stack: its broker's address, pid and state, exit 0", async (ctx) => {
    if (!inject('kafkaLocal')) ctx.skip(); // only where the tests run on the local stack's broker
    const r = await status({ KAFKA_BROKERS: undefined });
    expect(r.code).toBe(0);
    expect(r.data).toMatchObject({
      ok: true,
      kafka: {
        source: 'local',
        brokers: [{ address: inject('kafkaBrokers'), reachable: true }],
        pid: readPid(),
        state: 'up',
      },
    });
    expect(r.data.kafka.pid).toBeGreaterThan(0);
  });
});
