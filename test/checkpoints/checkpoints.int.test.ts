import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import type { KeyRing } from '../../src/checkpoints/signing.js';
import type { Db } from '../../src/db/database.js';
import { ValidationError } from '../../src/errors.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createReceiptStoreWithTestHooks } from '../../src/receipts/receipts.js';
import type { ResumeOptions } from '../../src/recovery/resume.js';
import { type Policy, resume, workflowDigestOf } from '../../src/recovery/resume.js';
import type { TaskPatch } from '../../src/schemas/taskPatch.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { cairnBundle } from '../support/cli.js';
import { waitForLeaseExpiry } from '../support/leases.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { resumeOptions } from './fixtures.js';

const run = promisify(execFile);
const WORKFLOW = { name: 'ship-feature', steps: ['plan', 'implement', 'review', 'test', 'deploy'] };
const WORKFLOW_DIGEST = workflowDigestOf(WORKFLOW);
const ring: KeyRing = {
  current: 'k2',
  keys: { k1: Buffer.from('old signing key'), k2: Buffer.from('current signing key') },
};
const policy =
  (over: Partial<Policy> = {}) =>
  async (): Promise<Policy> => ({
    version: 'policy-7',
    allowed: true,
    budgetLimitUsd: 1000,
    ...over,
  });

let tdb: TestDatabase;
let store: TaskStore;
let checkpoints: ReturnType<typeof createCheckpointer>;

/** Simulates storage corruption: bypasses the immutability triggers for one statement. */
async function tamper(db: Db, statement: ReturnType<typeof sql>) {
  await db.transaction().execute(async (t) => {
    await sql`SET LOCAL session_replication_role = replica`.execute(t);
    await statement.execute(t);
  });
}

function resumeOpts(extra: Partial<ResumeOptions> = {}) {
  return resumeOptions({ db: tdb.db, store, checkpoints }, { policy: policy(), ...extra });
}

async function seed(taskId: string) {
  await store.create({ task: newTask(taskId, { workflow_digest: WORKFLOW_DIGEST }), actor: AGENT });
  let v = 1;
  const patches: TaskPatch[] = [
    { status: 'implementing', gates: { plan_approved: true } },
    { artifacts: { code_files: ['src/a.ts'] } },
    { active_agents: ['coder'] }, // not a boundary
  ];
  for (const patch of patches) {
    const r = await store.update({ taskId, expectedVersion: v, patch, actor: AGENT });
    if (!r.ok) throw r.error;
    v = r.state.version;
  }
}

beforeAll(async () => {
  tdb = await createTestDatabase('checkpoints');
  checkpoints = createCheckpointer({ db: tdb.db, keyRing: ring });
  store = createTaskStore({ db: tdb.db, checkpointer: checkpoints });
});
afterAll(async () => {
  await tdb.drop();
});

describe('checkpoints', () => {
  it('are taken at semantic boundaries only, in the transaction of the change, signed and chained', async () => {
    await seed('cp-1');
    const list = await checkpoints.list('cp-1');
    expect(list.map((c) => [c.seq, c.checkpoint.state_version, c.checkpoint.reason])).toEqual([
      [3, 3, 'artifacts: code_files'],
      [2, 2, 'gate passed: plan_approved'],
      [1, 1, 'task created'],
    ]);
    for (let i = 0; i < list.length; i++)
      expect(await checkpoints.verify(list[i]!, list[i + 1])).toMatchObject({ ok: true });
    const newest = list[0]!.checkpoint;
    expect(newest.integrity.signature?.key_id).toBe('k2');
    expect(newest.integrity.previous_checkpoint_digest).toBe(list[1]!.digest);
    expect(newest.workflow_definition_digest).toBe(WORKFLOW_DIGEST);
    expect(newest.budget_consumed).toEqual({ currency_usd: 0, tokens: 0, hops: 0 });
    // Immutable, even for hand-written SQL.
    await expect(sql`UPDATE checkpoint SET reason = 'x'`.execute(tdb.db)).rejects.toThrow(
      /checkpoint is immutable/,
    );
  });

  it('refuses a value that looks like a credential, naming the field, and writes neither state nor checkpoint', async () => {
    await seed('cp-secret');
    const before = await checkpoints.list('cp-secret');
    const err = await store
      .update({
        taskId: 'cp-secret',
        expectedVersion: 4,
        patch: { artifacts: { review_report: 'https://bot:hunter2@git.example/review/1' } },
        actor: AGENT,
      })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ValidationError);
    expect((err as Error).message).toContain('artifacts.review_report: looks like a password in a URL');
    expect((err as Error).message).not.toContain('hunter2');
    expect((await store.get('cp-secret'))?.version).toBe(4);
    expect(await checkpoints.list('cp-secret')).toHaveLength(before.length);
  });
});

describe('resume', () => {
  it('falls back past a flipped snapshot byte, a bad signature and a broken chain, each audited', async () => {
    await seed('cp-corrupt');
    const [c3, c2, c1] = await checkpoints.list('cp-corrupt');
    // c3: one byte of its snapshot flipped on disk.
    const uri = c3!.checkpoint.state_snapshot_uri.split('/')[1]!;
    await tamper(
      tdb.db,
      sql`UPDATE checkpoint_snapshot SET bytes = overlay(bytes placing '#'::bytea from 20 for 1) WHERE snapshot_id = ${uri}::uuid`,
    );
    let plan = await resume('cp-corrupt', resumeOpts());
    expect(plan.outcome).toBe('resumed');
    expect(plan.checkpointId).toBe(c2!.checkpoint.checkpoint_id);
    expect(plan.skipped[0]!.reason).toMatch(/^snapshot digest mismatch/);
    let history = await store.history('cp-corrupt');
    expect(history.at(-1)!.reason).toMatch(
      new RegExp(
        `^resume: checkpoint ${c3!.checkpoint.checkpoint_id} failed verification \\(snapshot digest mismatch`,
      ),
    );
    await createLeaseManager({ db: tdb.db }).release(plan.lease!);

    // c2: signature replaced; c1 still fine.
    await tamper(
      tdb.db,
      sql`UPDATE checkpoint SET doc = jsonb_set(doc, '{integrity,signature,value}', '"AAAA"') WHERE checkpoint_id = ${c2!.checkpoint.checkpoint_id}::uuid`,
    );
    plan = await resume('cp-corrupt', resumeOpts());
    expect(plan.checkpointId).toBe(c1!.checkpoint.checkpoint_id);
    expect(plan.skipped.map((s) => s.reason)).toEqual([
      expect.stringMatching(/^snapshot digest mismatch/),
      'signature does not match (key k2)',
    ]);
    await createLeaseManager({ db: tdb.db }).release(plan.lease!);

    // c1: its chain link rewritten (and re-signed by no one): all corrupt -> failed, audited.
    await tamper(
      tdb.db,
      sql`UPDATE checkpoint SET doc = jsonb_set(doc, '{integrity,previous_checkpoint_digest}', ${JSON.stringify(`sha256:${'f'.repeat(64)}`)}::jsonb) WHERE checkpoint_id = ${c1!.checkpoint.checkpoint_id}::uuid`,
    );
    plan = await resume('cp-corrupt', resumeOpts());
    expect(plan.outcome).toBe('failed');
    expect(plan.state.status).toBe('failed');
    history = await store.history('cp-corrupt');
    expect(history.at(-1)!.reason).toBe('resume: no valid checkpoint (3 failed verification); task failed');
    expect(history.at(-2)!.reason).toMatch(/failed verification \((signature does not match|broken chain)/);
  });

  it('refuses a different workflow definition, naming both digests', async () => {
    await seed('cp-wf');
    await expect(
      resume('cp-wf', resumeOpts({ workflowDefinition: { ...WORKFLOW, steps: ['yolo'] } })),
    ).rejects.toThrow(
      new RegExp(`taken under workflow ${WORKFLOW_DIGEST}, the current definition is sha256:[0-9a-f]{64}`),
    );
  });

  it('re-reads policy and re-reserves budget under a lowered limit; settles a dead worker’s receipt; reports pending messages', async () => {
    await seed('cp-e2e');
    // A worker sends a message and dies after an irreversible effect's intent (its lease expires).
    const r = await store.update({
      taskId: 'cp-e2e',
      expectedVersion: 4,
      patch: { budget: { currency_spent_usd: 40 } },
      actor: AGENT,
      messages: [{ topic: 'cairn.tasks', payload: { step: 'deploying' } }],
      checkpoint: { reason: 'before deploy' },
    });
    if (!r.ok) throw r.error;
    const leases = createLeaseManager({ db: tdb.db });
    const lease = await leases.acquire({
      taskId: 'cp-e2e',
      branch: 'main',
      agentId: 'doomed',
      ttlMs: 200,
    });
    if (!lease.ok) throw new Error('lease');
    const dying = createReceiptStoreWithTestHooks(
      {
        db: tdb.db,
        checkpointer: checkpoints,
      },
      {
        afterIntent: () => {
          throw new Error('SIGKILL');
        },
      },
    );
    await expect(
      dying.runOnce({
        taskId: 'cp-e2e',
        step: 'deploy',
        tool: 'deployer',
        args: {},
        lease,
        irreversible: true,
        onUncertain: 'gate',
        effect: async () => 1,
      }),
    ).rejects.toThrow('SIGKILL');
    expect((await checkpoints.list('cp-e2e'))[0]!.checkpoint.reason).toMatch(
      /^before irreversible effect: deployer at deploy/,
    );
    await waitForLeaseExpiry(tdb.db, 'cp-e2e', 'main');

    const compensated: string[] = [];
    const plan = await resume(
      'cp-e2e',
      resumeOpts({
        policy: policy({ version: 'policy-8', budgetLimitUsd: 60 }),
        compensators: {
          deployer: async ({ idempotencyKey }: { idempotencyKey: string }) =>
            compensated.push(idempotencyKey),
        },
      }),
    );
    expect(plan).toMatchObject({
      outcome: 'resumed',
      policyVersion: 'policy-8',
      budget: { committedBefore: 100, committedAfter: 60, limit: 60 },
      receipts: [{ tool: 'deployer', step: 'deploy', action: 'compensated' }],
    });
    expect(compensated).toHaveLength(1);
    expect(plan.pendingMessages).toEqual([{ messageId: r.messageIds[0], state: 'queued' }]);
    expect(plan.lease?.agentId).toBe('resumer');
    // The new limit holds from now on.
    await expect(
      store.update({
        taskId: 'cp-e2e',
        expectedVersion: plan.state.version,
        patch: { budget: { currency_spent_usd: 70 } },
        actor: AGENT,
      }),
    ).rejects.toThrow(/budget\.currency_spent_usd: must not exceed currency_committed_usd \(60\)/);
  });
});

describe('operator view', () => {
  it('`cairn checkpoint verify` flags the corrupt ones (exit 1); `cairn task show` prints the timeline', async () => {
    const env = {
      ...process.env,
      DATABASE_URL: tdb.url,
      CAIRN_CHECKPOINT_KEYS: 'k2:current signing key,k1:old signing key',
    };
    const verify = await run(process.execPath, [cairnBundle(), 'checkpoint', 'verify', 'cp-corrupt'], {
      cwd: repoRoot,
      env,
    }).then(
      () => ({ code: 0, stdout: '' }),
      (e: { code: number; stdout: string }) => e,
    );
    expect(verify.code).toBe(1);
    expect(verify.stdout).toMatch(/#3 {2}CORRUPT \(snapshot digest mismatch/);
    expect(verify.stdout).toMatch(/#2 {2}CORRUPT \(signature does not match \(key k2\)\)/);
    const ok = await run(process.execPath, [cairnBundle(), 'checkpoint', 'verify', 'cp-1'], {
      cwd: repoRoot,
      env,
    });
    expect(ok.stdout.split('\n').filter((l) => l.includes(' ok '))).toHaveLength(3);
    const dir = mkdtempSync(join(tmpdir(), 'cairn-resume-'));
    writeFileSync(join(dir, 'wf.json'), JSON.stringify(WORKFLOW));
    writeFileSync(
      join(dir, 'policy.json'),
      JSON.stringify({ version: 'policy-cli', allowed: true, budgetLimitUsd: 80 }),
    );
    const resumed = await run(
      process.execPath,
      [
        cairnBundle(),
        'resume',
        'cp-1',
        '--workflow',
        join(dir, 'wf.json'),
        '--policy',
        join(dir, 'policy.json'),
        '--agent',
        'ops',
      ],
      { cwd: repoRoot, env },
    );
    expect(resumed.stdout).toMatch(/^cp-1: resumed from checkpoint [0-9a-f-]{36} at v5 implementing/);
    expect(resumed.stdout).toContain('budget committed 100 -> 80 USD (limit 80, policy-cli)');
    expect(resumed.stdout).toContain('lease held by ops, fencing token 1');
    const show = await run(process.execPath, [cairnBundle(), 'task', 'show', 'cp-1'], { cwd: repoRoot, env });
    expect(show.stdout).toContain('cp-1 (tenant acme) v5 implementing');
    expect(show.stdout).toMatch(
      /v2 .* spiffe:\/\/acme\.example\/agents\/planner .*\[replace \/status, replace \/gates\/plan_approved\]/,
    );
  });
});
