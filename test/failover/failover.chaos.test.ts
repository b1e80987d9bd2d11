import { describe, expect, inject, it } from 'vitest';
import { findPgBin } from '../../scripts/failover/pgCluster.js';
import { runFailover } from '../../scripts/failover/scenario.js';

const log = (line: string) => process.stderr.write(`${line}\n`);
const run = (mode: 'sync' | 'async') =>
  runFailover({ mode, tasks: 10, workMs: 100, kafkaBrokers: inject('kafkaBrokers'), timeoutS: 90, log });

// Needs PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup); CI has them.
let noBinaries = '';
try {
  findPgBin();
} catch (err) {
  noBinaries = (err as Error).message;
  console.warn(`regional failover tests skipped: ${noBinaries}`);
}

describe.skipIf(noBinaries !== '')('regional failover (a real primary, standby and processes)', () => {
  it('synchronous replication: nothing committed is lost, every task completes, no effect twice', async () => {
    const r = await run('sync');
    expect(r.checks.filter((c) => c.violations > 0)).toEqual([]);
    expect(r.witness.acked).toBeGreaterThan(0);
    expect(r.witness.lost).toBe(0);
    expect(r.truth.tasksBehind).toEqual([]);
    expect(r.report.divergedTasks).toEqual([]);
    expect(r.resumed).toBeGreaterThan(0);
    expect(r.rtoMs).toBeGreaterThan(0);
  });

  it('asynchronous replication: what was lost is detected and held, the rest completes, no effect twice', async () => {
    const r = await run('async');
    expect(r.checks.filter((c) => c.violations > 0)).toEqual([]);
    // The standby was cut off while region A went on: something was lost, and region A's
    // own data (restarted after the test) says the check flagged nothing that was not.
    expect(r.witness.lost).toBeGreaterThan(0);
    expect(r.truth.tasksBehind.length).toBeGreaterThan(0);
    expect(r.truth.falselyFlagged).toEqual([]);
    // Every task whose loss the outside world saw is held, not resumed.
    for (const l of [...r.report.lostTransitions, ...r.report.lostConsumptions])
      expect(r.report.divergedTasks).toContain(l.taskId);
    expect(r.report.divergedTasks.some((id) => id.startsWith('witness-'))).toBe(true);
  });
});
