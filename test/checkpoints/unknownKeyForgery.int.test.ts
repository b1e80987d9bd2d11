/**
 * adversary5: 09d5b63 made a checkpoint "signed" by a key id the ring does not hold an outage
 * ('unavailable'), checked BEFORE the document digest and the chain. Anyone with INSERT on
 * checkpoint (the tenant's role has it, 0006) writes a forged newest checkpoint whose
 * signature names a key id that never existed, and whose document does not even match its
 * recorded digest. Expected: it is invalid (a forgery, data wrong), resume falls back past it
 * to the newest real checkpoint and `cairn checkpoint verify` reports it CORRUPT (exit 1).
 * Observed: 'unavailable' -> resume stops with UnavailableError for good (no key can ever be
 * "put back in the ring"), and verify says outage (exit 75): the forgery is hidden.
 */
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { promisify } from 'node:util';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { canonicalBytes, sha256 } from '../../src/canonical.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import type { Checkpoint } from '../../src/checkpoints/schema.js';
import type { KeyRing } from '../../src/checkpoints/signing.js';
import { resume } from '../../src/recovery/resume.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { cairnBundle } from '../support/cli.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { resumeOptions, seedPlannedTask } from './fixtures.js';

const run = promisify(execFile);
const ring: KeyRing = { current: 'k1', keys: { k1: Buffer.from('adversary5 signing key') } };
let tdb: TestDatabase;
let store: TaskStore;
let checkpoints: ReturnType<typeof createCheckpointer>;

beforeAll(async () => {
  tdb = await createTestDatabase('adv5_unknown_key');
  checkpoints = createCheckpointer({ db: tdb.db, keyRing: ring });
  store = createTaskStore({ db: tdb.db, checkpointer: checkpoints });
});
afterAll(async () => {
  await tdb?.drop();
});

async function forgeWithUnknownKey(taskId: string): Promise<Checkpoint> {
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
    reason: 'forged',
    state_snapshot_uri: `pg:checkpoint_snapshot/${snapshotId}`,
    integrity: {
      snapshot_digest: sha256(bytes),
      previous_checkpoint_digest: newest!.digest,
      signature: { alg: 'HMAC-SHA256', key_id: 'k-never-existed', value: 'AAAA' },
    },
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
      // Not even the document's own digest: plainly corrupt.
      digest: '0'.repeat(64),
    })
    .execute();
  return doc;
}

it('a corrupt checkpoint whose signature names a key the ring never had is invalid, not an outage: the checks that need no key come first', async () => {
  await seedPlannedTask(store, 'adv5-1');
  const [real] = await checkpoints.list('adv5-1');
  const forged = await forgeWithUnknownKey('adv5-1');
  const list = await checkpoints.list('adv5-1');
  expect(list[0]!.checkpoint.checkpoint_id).toBe(forged.checkpoint_id);
  const v = await checkpoints.verify(list[0]!, list[1]);

  const plan = await resume('adv5-1', resumeOptions({ db: tdb.db, store, checkpoints })).then(
    (p) => ({ outcome: p.outcome, from: p.checkpointId }),
    (e: Error) => ({ outcome: e.name, from: undefined }),
  );
  const { CAIRN_CHECKPOINT_KEYS: _k, ...env } = process.env;
  const verify = await run(process.execPath, [cairnBundle(), 'checkpoint', 'verify', 'adv5-1'], {
    cwd: repoRoot,
    env: { ...env, DATABASE_URL: tdb.url, CAIRN_CHECKPOINT_KEYS: `k1:${ring.keys.k1!.toString()}` },
  }).then(
    () => 0,
    (e: { code: number }) => e.code,
  );
  expect({ reason: v.ok ? 'ok' : v.reason, plan, verifyExit: verify }).toEqual({
    reason: 'invalid',
    plan: { outcome: 'resumed', from: real!.checkpoint.checkpoint_id },
    verifyExit: 1,
  });
});
