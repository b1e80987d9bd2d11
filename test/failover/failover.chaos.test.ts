import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, inject, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { findPgBin } from '../../scripts/failover/pgCluster.js';
import { runFailover } from '../../scripts/failover/scenario.js';
import { cairnBundle } from '../support/cli.js';

const exec = promisify(execFile);

const log = (line: string) => process.stderr.write(`${line}\n`);
const run = (mode: 'sync' | 'async', afterCheck?: Parameters<typeof runFailover>[0]['afterCheck']) =>
  runFailover({
    mode,
    tasks: 10,
    workMs: 100,
    kafkaBrokers: inject('kafkaBrokers'),
    timeoutS: 90,
    log,
    ...(afterCheck ? { afterCheck } : {}),
  });

/** `cairn failover check` against the promoted database, as an operator would run it. */
async function cliCheck(
  databaseUrl: string,
  topics: string[],
  groups: Array<{ groupId: string; topics: string[] }>,
) {
  const args = ['failover', 'check', '--topics', topics.join(','), '--json'];
  for (const g of groups) args.push('--group', `${g.groupId}=${g.topics.join(',')}`);
  try {
    const r = await exec(process.execPath, [cairnBundle(), ...args], {
      cwd: repoRoot,
      env: { ...process.env, DATABASE_URL: databaseUrl, KAFKA_BROKERS: inject('kafkaBrokers') },
    });
    return { code: 0, report: JSON.parse(r.stdout) };
  } catch (e) {
    const x = e as { code: number; stdout: string };
    return { code: x.code, report: JSON.parse(x.stdout) };
  }
}

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
    // Region A's data may still be ahead by a commit that was waiting for the standby when
    // the primary died: never acknowledged, never published (seen once): not a loss.
    expect(r.report.divergedTasks).toEqual([]);
    // Nothing was lost, so the changelog has nothing to rebuild (and nothing it cannot prove).
    expect(r.changelog.rebuilt).toEqual([]);
    expect(r.changelog.incomplete).toEqual([]);
    expect(r.resumed).toBeGreaterThan(0);
    expect(r.rtoMs).toBeGreaterThan(0);
  });

  it('asynchronous replication: what was lost is rebuilt from the changelog (digests as in region A) or held, everything else completes, no effect twice', async () => {
    let cli: Awaited<ReturnType<typeof cliCheck>> | undefined;
    const r = await run('async', async (url, topics, groups) => {
      cli = await cliCheck(url, topics, groups);
    });
    expect(r.checks.filter((c) => c.violations > 0)).toEqual([]);
    // The standby was cut off while region A went on: something was lost, and region A's
    // own data (restarted after the test) says the check flagged nothing that was not.
    expect(r.witness.lost).toBeGreaterThan(0);
    expect(r.truth.tasksBehind.length).toBeGreaterThan(0);
    expect(r.truth.falselyFlagged).toEqual([]);
    // The changelog rebuilt lost transitions (the checks include: each rebuilt task's state
    // digest equals region A's at that version, and rebuilt tasks complete with one deploy).
    expect(r.changelog.rebuilt.length).toBeGreaterThan(0);
    expect(r.changelog.refused).toBe(0);
    // Every task whose loss the outside world still sees after the replay is held, not resumed.
    for (const l of [...r.report.lostTransitions, ...r.report.lostConsumptions])
      expect(r.held).toContain(l.taskId);
    for (const id of r.changelog.incomplete) expect(r.held).toContain(id);
    for (const id of r.changelog.rebuilt) expect(r.held).not.toContain(id);
    // The operator's command, after the replay, finds the same losses (it has no sink to ask about receipts).
    const seen = [...r.report.lostTransitions, ...r.report.lostConsumptions].map((l) => l.taskId);
    expect(cli?.code).toBe(seen.length > 0 ? 1 : 0);
    expect(cli?.report.divergedTasks).toEqual([...new Set(seen)].sort());
  });
});
