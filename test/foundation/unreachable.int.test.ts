import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../scripts/stack/paths.js';
import { resolveStack } from '../../scripts/stack/resolve.js';

const run = promisify(execFile);

// Port 1 on loopback: nothing listens there, so connections are refused at once.
describe('unreachable services give a clear error, not a hang', () => {
  it('cairn migrate names the Postgres address it tried and what to do', async () => {
    const started = Date.now();
    const result = await run('npx', ['tsx', 'src/cli/main.ts', 'migrate'], {
      cwd: repoRoot,
      env: { ...process.env, DATABASE_URL: 'postgres://cairn:s3cret@127.0.0.1:1/nowhere' },
    }).then(
      () => ({ code: 0, stderr: '' }),
      (err: { code: number; stderr: string }) => err,
    );
    expect(result.code).toBe(1);
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
});
