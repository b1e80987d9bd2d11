import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promisify } from 'node:util';
import pg from 'pg';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';

const run = promisify(execFile);
const database = `cairn_t_demo_${randomBytes(4).toString('hex')}`;

afterAll(async () => {
  const admin = new pg.Client({ connectionString: inject('databaseUrl') });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
  await admin.end();
});

describe('the demo', () => {
  it('`npm run demo -- --tasks 10 --chaos low` ends with every task complete and 0 violations', async () => {
    const { stdout, stderr } = await run(
      'npx',
      [
        'tsx',
        'scripts/demo.ts',
        '--tasks',
        '10',
        '--chaos',
        'low',
        '--seed',
        '7',
        '--work-ms',
        '150',
        '--database',
        database,
      ],
      {
        cwd: repoRoot,
        env: { ...process.env, DATABASE_URL: inject('databaseUrl'), KAFKA_BROKERS: inject('kafkaBrokers') },
        timeout: 200_000,
      },
    );
    const summary = JSON.parse(stdout.trim().split('\n').at(-1)!);
    expect(summary).toMatchObject({
      demo: true,
      tasks: 10,
      complete: 10,
      violations: 0,
      deploys_executed: 10,
      chaos: 'low',
    });
    expect(summary.crashes_injected).toBeGreaterThan(0);
    // One task followed across every process by its trace id (OpenTelemetry, the demo's file exporter).
    expect(summary.trace.processes).toEqual([
      'coder',
      'orchestrator',
      'planner',
      'relay',
      'reviewer',
      'tester',
    ]);
    expect(summary.trace.spans).toBeGreaterThanOrEqual(9);
    expect(stdout).toContain(`trace of demo-0000: ${summary.trace.trace_id}`);
    expect(stdout).toMatch(/deploys executed exactly once \(sink\) +10 +10 \(0 tasks wrong\) +ok/);
    // It used the local stack's broker (already running, from this test run): it says so, and how to stop it.
    if (inject('kafkaLocal')) {
      expect(stderr).toMatch(
        /\[demo\] the local stack's Kafka broker on \S+ \(pid \d+\) is still running\. Stop it with `npm run stack:down`/,
      );
    } else {
      expect(stderr).not.toContain('npm run stack:down');
    }
  });
});
