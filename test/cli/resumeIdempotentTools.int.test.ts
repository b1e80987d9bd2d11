/**
 * `cairn resume --idempotent-tools a,b`: a receipt a dead worker left started, of a named tool,
 * is left uncertain for the worker's retry with the same key (action `retry`); without the flag
 * it is gated, as before. A malformed list is refused by name before anything is opened.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { seedPlannedTask, WORKFLOW } from '../checkpoints/fixtures.js';
import { cairnBundle } from '../support/cli.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const run = promisify(execFile);

let tdb: TestDatabase;
let store: TaskStore;
let dir: string;

beforeAll(async () => {
  tdb = await createTestDatabase('resume_idempotent_tools');
  store = createTaskStore({ db: tdb.db, checkpointer: createCheckpointer({ db: tdb.db }) });
  dir = mkdtempSync(join(tmpdir(), 'cairn-idem-'));
  writeFileSync(join(dir, 'wf.json'), JSON.stringify(WORKFLOW));
  writeFileSync(
    join(dir, 'policy.json'),
    JSON.stringify({ version: 'policy-idem', allowed: true, budgetLimitUsd: 1000 }),
  );
});
afterAll(async () => {
  await tdb?.drop();
});

async function cairnResume(taskId: string, ...extra: string[]) {
  const args = ['resume', taskId, '--workflow', join(dir, 'wf.json'), '--policy', join(dir, 'policy.json')];
  return run(process.execPath, [cairnBundle(), ...args, '--agent', 'ops', ...extra], {
    cwd: repoRoot,
    env: { ...process.env, DATABASE_URL: tdb.url },
  }).then(
    (r) => ({ code: 0, stdout: r.stdout, stderr: r.stderr }),
    (e: { code: number; stdout: string; stderr: string }) => e,
  );
}

/** A planned task whose worker died inside a deploy an hour ago: its receipt is still started. */
async function deployLeftStarted(taskId: string): Promise<void> {
  await seedPlannedTask(store, taskId);
  await sql`INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status, worker, started_at)
            VALUES (gen_random_uuid(), ${`${taskId}/deploy`}, ${taskId}, 'deploy', 'deployer', 'sha256:aa', 'started', 'gone',
                    now() - interval '1 hour')`.execute(tdb.db);
}

const statusOf = async (taskId: string) =>
  (await tdb.db.selectFrom('tool_receipt').select('status').where('task_id', '=', taskId).executeTakeFirst())
    ?.status;

describe('cairn resume --idempotent-tools', () => {
  it('leaves the named tool’s receipt uncertain for a retry; without the flag it is gated', async () => {
    await deployLeftStarted('idem-1');
    const r = await cairnResume('idem-1', '--idempotent-tools', 'mailer, deployer');
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/receipt \S+ deployer at deploy: retry/);
    expect(await statusOf('idem-1')).toBe('uncertain');

    await deployLeftStarted('idem-2');
    const g = await cairnResume('idem-2');
    expect(g.code).toBe(0);
    expect(g.stdout).toMatch(/receipt \S+ deployer at deploy: gated/);
    expect(await statusOf('idem-2')).toBe('gated');
  });

  it('an empty tool name in the list is refused by name; nothing is written', async () => {
    await deployLeftStarted('idem-3');
    const before = await store.history('idem-3');
    const r = await cairnResume('idem-3', '--idempotent-tools', 'deployer,,mailer');
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/--idempotent-tools/);
    expect(r.stderr).toMatch(/deployer,,mailer/);
    expect(await statusOf('idem-3')).toBe('started');
    expect(await store.history('idem-3')).toEqual(before);
  });
});
