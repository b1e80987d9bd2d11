/**
 * `cairn resume --policy F`: the policy file is checked (parsePolicy) before anything
 * connects. "allowed": "false" is a string, not a boolean: it is refused by name, never
 * read as true, and nothing is written, not even a lease.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { seedPlannedTask, WORKFLOW } from '../checkpoints/fixtures.js';
import { cairnBundle } from '../support/cli.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const run = promisify(execFile);

let tdb: TestDatabase;
let store: TaskStore;
let dir: string;

beforeAll(async () => {
  tdb = await createTestDatabase('resume_policy_file');
  store = createTaskStore({ db: tdb.db, checkpointer: createCheckpointer({ db: tdb.db }) });
  dir = mkdtempSync(join(tmpdir(), 'cairn-policy-'));
  writeFileSync(join(dir, 'wf.json'), JSON.stringify(WORKFLOW));
  // "false" the string: truthy in JavaScript, so a cast would read it as "allowed".
  writeFileSync(
    join(dir, 'policy.json'),
    JSON.stringify({ version: 'policy-cli', allowed: 'false', budgetLimitUsd: 10 }),
  );
});
afterAll(async () => {
  await tdb?.drop();
});

async function cairnResume(taskId: string) {
  const args = ['resume', taskId, '--workflow', join(dir, 'wf.json'), '--policy', join(dir, 'policy.json')];
  return run(process.execPath, [cairnBundle(), ...args, '--agent', 'ops'], {
    cwd: repoRoot,
    env: { ...process.env, DATABASE_URL: tdb.url },
  }).then(
    (r) => ({ code: 0, stdout: r.stdout, stderr: r.stderr }),
    (e: { code: number; stdout: string; stderr: string }) => e,
  );
}

const seed = (taskId: string) => seedPlannedTask(store, taskId);

const leaseRows = (taskId: string) =>
  tdb.db.selectFrom('task_lease').select(['holder', 'fencing_token']).where('task_id', '=', taskId).execute();

describe('cairn resume with a bad policy file', () => {
  it('"allowed": "false" (a string) exits non-zero naming `allowed`; the task, its audit log and its lease are untouched', async () => {
    await seed('policy-str');
    const before = await store.history('policy-str');

    const r = await cairnResume('policy-str');
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/allowed/);
    expect(r.stdout).not.toMatch(/resumed/);
    expect((await store.get('policy-str'))!.version).toBe(2);
    expect((await store.get('policy-str'))!.budget.currency_committed_usd).toBe(100);
    expect(await store.history('policy-str')).toEqual(before);
    // Checked before connecting: no lease was taken (and released) for it.
    expect(await leaseRows('policy-str')).toEqual([]);
  });

  it('while a live worker holds the lease, the bad field is still what the operator is told about', async () => {
    await seed('policy-held');
    const live = await createLeaseManager({ db: tdb.db }).acquire({
      taskId: 'policy-held',
      branch: 'main',
      agentId: 'live',
      ttlMs: 60_000,
    });
    if (!live.ok) throw new Error('the live worker should get the lease');

    const r = await cairnResume('policy-held');
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/allowed/);
    expect((await store.get('policy-held'))!.version).toBe(2);
    expect(await leaseRows('policy-held')).toEqual([{ holder: 'live', fencing_token: live.fencingToken }]);
  });
});
