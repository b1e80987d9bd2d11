// Review (a missing key is an outage, not corruption): checkpoints signed with key k1; the
// resuming process's key ring no longer holds k1 (rotated to k2 and the old key left out of
// CAIRN_CHECKPOINT_KEYS, or a secret store that did not answer for it). Every checkpoint is then
// taken for forged: resume audits each as "failed verification" and marks the task FAILED, a
// terminal status that never changes again. Expected, as for a missing data key or a KMS that
// is down (invariant 13): resume stops with UnavailableError and writes nothing.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import type { KeyRing } from '../../src/checkpoints/signing.js';
import { UnavailableError } from '../../src/errors.js';
import { resume } from '../../src/recovery/resume.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { resumeOptions, seedPlannedTask } from './fixtures.js';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase('resume_signing_key');
});
afterAll(async () => {
  await t?.drop();
});

it('a checkpoint signed by a key the ring does not hold stops resume; the task is not failed', async () => {
  const old: KeyRing = { current: 'k1', keys: { k1: Buffer.from('signing key one') } };
  const rotated: KeyRing = { current: 'k2', keys: { k2: Buffer.from('signing key two') } };
  const writer = createTaskStore({ db: t.db, checkpointer: createCheckpointer({ db: t.db, keyRing: old }) });
  await seedPlannedTask(writer, 'T-sig');
  const before = (await writer.get('T-sig'))!;

  const checkpoints = createCheckpointer({ db: t.db, keyRing: rotated });
  const store = createTaskStore({ db: t.db, checkpointer: checkpoints, cacheSize: 0 });
  const outcome = await resume('T-sig', resumeOptions({ db: t.db, store, checkpoints })).then(
    (plan) => ({ outcome: plan.outcome, skipped: plan.skipped.map((s) => s.reason) }),
    (err: unknown) => err,
  );
  const after = (await store.get('T-sig'))!;
  expect({ status: after.status, version: after.version }).toEqual({
    status: before.status,
    version: before.version,
  });
  expect(outcome).toBeInstanceOf(UnavailableError);
});
