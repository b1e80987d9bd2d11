/**
 * Issue 14.4: anyone with INSERT on the checkpoint table can write a checkpoint. One that
 * says it was upcast from v1 (in its free-text reason, while its schema_version column says
 * v2), carries no signature, names a workflow of its author's choosing and points at a real
 * snapshot whose digest matches: only the signature (or legacy) check can catch it.
 */
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { canonicalBytes, sha256 } from '../../src/canonical.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import type { Checkpoint } from '../../src/checkpoints/schema.js';
import { type KeyRing, signedBytes } from '../../src/checkpoints/signing.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { resume, workflowDigestOf } from '../../src/recovery/resume.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { cairnBundle } from '../support/cli.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { resumeOptions, seedPlannedTask, WORKFLOW } from './fixtures.js';

const run = promisify(execFile);
/** The workflow the forger wants the task resumed under. */
const FORGED_WORKFLOW = { name: 'ship-feature', steps: ['deploy'] };
const ring: KeyRing = { current: 'k1', keys: { k1: Buffer.from('forged-test signing key') } };
const RESUMER = 'spiffe://acme.example/cairn/recovery';

let tdb: TestDatabase;
let store: TaskStore;
let checkpoints: ReturnType<typeof createCheckpointer>;

beforeAll(async () => {
  tdb = await createTestDatabase('forged_checkpoint');
  checkpoints = createCheckpointer({ db: tdb.db, keyRing: ring });
  store = createTaskStore({ db: tdb.db, checkpointer: checkpoints });
});
afterAll(async () => {
  await tdb?.drop();
});

/** A task with two signed checkpoints (created, plan approved). */
const seed = (taskId: string) => seedPlannedTask(store, taskId);

/**
 * Writes, by hand, a newer checkpoint row: schema_version v2, reason "upcast from
 * oaies.checkpoint.v1", no signature, the forger's workflow digest, chained to the newest
 * real checkpoint, and a real snapshot of the task's current state with its true digest.
 */
async function forge(taskId: string): Promise<Checkpoint> {
  const [newest] = await checkpoints.list(taskId);
  const state = (await store.get(taskId))!;
  const bytes = canonicalBytes(state);
  const snapshotId = randomUUID();
  await tdb.db
    .insertInto('checkpoint_snapshot')
    .values({ snapshot_id: snapshotId, task_id: taskId, bytes, key_id: null })
    .execute();
  const doc: Checkpoint = {
    ...newest!.checkpoint,
    checkpoint_id: randomUUID(),
    state_version: state.version,
    created_by: 'spiffe://acme.example/agents/forger',
    reason: 'upcast from oaies.checkpoint.v1',
    workflow_definition_digest: workflowDigestOf(FORGED_WORKFLOW),
    state_snapshot_uri: `pg:checkpoint_snapshot/${snapshotId}`,
    integrity: { snapshot_digest: sha256(bytes), previous_checkpoint_digest: newest!.digest },
  };
  await tdb.db
    .insertInto('checkpoint')
    .values({
      checkpoint_id: doc.checkpoint_id,
      task_id: taskId,
      seq: newest!.seq + 1,
      state_version: doc.state_version,
      schema_version: 'oaies.checkpoint.v2',
      reason: doc.reason,
      doc: JSON.stringify(doc),
      digest: sha256(signedBytes(doc)),
    })
    .execute();
  return doc;
}

function resumeOpts(workflowDefinition: unknown) {
  return resumeOptions({ db: tdb.db, store, checkpoints }, { workflowDefinition, actor: RESUMER });
}

async function cairnCheckpointVerify(taskId: string, keys?: string) {
  const { CAIRN_CHECKPOINT_KEYS: _k, ...env } = process.env;
  return run(process.execPath, [cairnBundle(), 'checkpoint', 'verify', taskId], {
    cwd: repoRoot,
    env: { ...env, DATABASE_URL: tdb.url, ...(keys ? { CAIRN_CHECKPOINT_KEYS: keys } : {}) },
  }).then(
    (r) => ({ code: 0, stdout: r.stdout }),
    (e: { code: number; stdout: string }) => ({ code: e.code, stdout: e.stdout }),
  );
}

describe('a forged unsigned checkpoint (issue 14.4)', () => {
  it('an unsigned checkpoint claiming to be upcast from v1 does not verify under a key ring, and resume falls back past it', async () => {
    await seed('forged-1');
    const [real] = await checkpoints.list('forged-1');
    const forged = await forge('forged-1');

    const list = await checkpoints.list('forged-1');
    expect(list[0]!.checkpoint.checkpoint_id).toBe(forged.checkpoint_id);
    const v = await checkpoints.verify(list[0]!, list[1]);
    expect(v).toMatchObject({ ok: false, reason: 'invalid', message: expect.stringMatching(/not signed/) });

    // Resumed with the real workflow: from the newest real checkpoint, the forged one audited.
    const plan = await resume('forged-1', resumeOpts(WORKFLOW));
    expect(plan.outcome).toBe('resumed');
    expect(plan.checkpointId).toBe(real!.checkpoint.checkpoint_id);
    expect(plan.skipped).toEqual([
      { checkpointId: forged.checkpoint_id, reason: expect.stringMatching(/not signed/) },
    ]);
    const history = await store.history('forged-1');
    expect(history.at(-1)!.reason).toMatch(
      new RegExp(`^resume: checkpoint ${forged.checkpoint_id} failed verification \\(.*not signed`),
    );
    await createLeaseManager({ db: tdb.db }).release(plan.lease!);

    // Resumed with the forger's workflow: refused, never resumed under it.
    const before = (await store.get('forged-1'))!.version;
    const forgedRun = await resume('forged-1', resumeOpts(FORGED_WORKFLOW)).then(
      (p) => p,
      (e: Error) => e,
    );
    expect(forgedRun).toBeInstanceOf(Error);
    expect((forgedRun as Error).message).toMatch(
      new RegExp(`taken under workflow ${workflowDigestOf(WORKFLOW)}`),
    );
    // Only the fallback past the forged checkpoint was audited.
    const after = await store.history('forged-1');
    expect(after.slice(history.length).map((h) => h.reason)).toEqual([
      expect.stringMatching(`^resume: checkpoint ${forged.checkpoint_id} failed verification`),
    ]);
    expect((await store.get('forged-1'))!.version).toBe(before + 1);
  });

  it('`cairn checkpoint verify` flags the forged row with the key ring, and without one says no signature was checked instead of "ok"', async () => {
    await seed('forged-cli');
    await forge('forged-cli');

    const keyed = await cairnCheckpointVerify('forged-cli', 'k1:forged-test signing key');
    expect(keyed.code).toBe(1);
    expect(keyed.stdout).toMatch(/#3 {2}CORRUPT \(checkpoint is not signed/);
    expect(keyed.stdout.split('\n').filter((l) => /^#[12] {2}ok /.test(l))).toHaveLength(2);

    // Without CAIRN_CHECKPOINT_KEYS no signature can be checked: no row may be called "ok".
    const bare = await cairnCheckpointVerify('forged-cli');
    const rows = bare.stdout.split('\n').filter((l) => l.startsWith('#'));
    expect(rows).toHaveLength(3);
    for (const row of rows) {
      expect(row).not.toMatch(/^#\d+ {2}ok\b/);
      expect(row).toMatch(/signature (was )?not checked/i);
    }
  });
});
