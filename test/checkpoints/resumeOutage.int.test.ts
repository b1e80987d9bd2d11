/**
 * Issues 14.5 and 14.6: resume never takes an outage for corruption (a checkpoint it cannot
 * read now is not a bad checkpoint), and never writes to a task it does not own (the lease
 * comes first, and every write after carries it as a fence).
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Checkpointer } from '../../src/checkpoints/checkpoints.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import type { KeyRing } from '../../src/checkpoints/signing.js';
import { type KeyProvider, localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys } from '../../src/crypto/tenantKeys.js';
import { LeaseHeldError, LeaseLostError, UnavailableError } from '../../src/errors.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import type { ResumeOptions } from '../../src/recovery/resume.js';
import { type Policy, resume } from '../../src/recovery/resume.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { AGENT } from '../state/fixtures.js';
import { switchableProvider } from '../support/keyProviders.js';
import { waitForLeaseExpiry } from '../support/leases.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { resumeOptions, seedPlannedTask } from './fixtures.js';

const ring: KeyRing = { current: 'k1', keys: { k1: Buffer.from('resume-outage signing key') } };
const RESUMER = 'spiffe://acme.example/cairn/recovery';

let tdb: TestDatabase;
let keyringPath: string;

beforeAll(async () => {
  tdb = await createTestDatabase('resume_outage');
  keyringPath = join(mkdtempSync(join(tmpdir(), 'cairn-outage-')), 'keyring.json');
  writeKeyring(keyringPath);
});
afterAll(async () => {
  await tdb?.drop();
});

function resumeOpts(store: TaskStore, checkpoints: Checkpointer, extra: Partial<ResumeOptions> = {}) {
  return resumeOptions({ db: tdb.db, store, checkpoints }, { actor: RESUMER, ...extra });
}

/** What resume must leave alone: version, status, the audit log. */
async function snapshotOf(store: TaskStore, taskId: string) {
  const state = (await store.get(taskId))!;
  const history = await store.history(taskId);
  return { version: state.version, status: state.status, audit: history.map((h) => h.reason) };
}

/** Leases on the task that someone holds right now (database clock). */
async function heldLeases(taskId: string) {
  const { rows } = await sql<{ holder: string; fencing_token: number }>`
    SELECT holder, fencing_token FROM task_lease
     WHERE task_id = ${taskId} AND holder IS NOT NULL AND expires_at > now()`.execute(tdb.db);
  return rows;
}

/** An encrypted task with two checkpoints, written while the key provider was up. */
async function seedEncrypted(taskId: string, tenant: string, provider: KeyProvider) {
  const keys = createTenantKeys({ db: tdb.db, provider });
  await keys.addTenant(tenant);
  const store = createTaskStore({ db: tdb.db, checkpointer: createCheckpointer({ db: tdb.db, keys }) });
  await seedPlannedTask(store, taskId, tenant);
  return keys;
}

/** The resuming process: tenant keys of its own (nothing unwrapped is cached yet). */
function resumer(provider: KeyProvider) {
  const checkpoints = createCheckpointer({
    db: tdb.db,
    keys: createTenantKeys({ db: tdb.db, provider }),
  });
  return { store: createTaskStore({ db: tdb.db, checkpointer: checkpoints }), checkpoints };
}

describe('an outage is not corruption (issue 14.5)', () => {
  it('a key provider that is down stops resume with UnavailableError: version, status, audit log unchanged, no lease held', async () => {
    const { provider, s } = switchableProvider(localKeyring(keyringPath));
    await seedEncrypted('outage-kms', 'outage-a', provider);
    const { store, checkpoints } = resumer(provider);
    const before = await snapshotOf(store, 'outage-kms');

    s.down = true;
    const err = await resume('outage-kms', resumeOpts(store, checkpoints)).then(
      (plan) => plan,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(UnavailableError);
    expect(err).toMatchObject({ code: 'unavailable', retriable: true });
    expect((err as Error).message).toMatch(/KMS unreachable/);
    expect(await snapshotOf(store, 'outage-kms')).toEqual(before);
    expect(await heldLeases('outage-kms')).toEqual([]);

    // The provider is back: the same resume goes through from the newest checkpoint.
    s.down = false;
    const plan = await resume('outage-kms', resumeOpts(store, checkpoints));
    expect(plan).toMatchObject({ outcome: 'resumed', skipped: [] });
    await createLeaseManager({ db: tdb.db }).release(plan.lease!);
  });

  it("a tenant's shredded data key stops resume too (UnavailableError); the task is not failed", async () => {
    const { provider } = switchableProvider(localKeyring(keyringPath));
    const keys = await seedEncrypted('outage-shred', 'outage-b', provider);
    const { store, checkpoints } = resumer(provider);
    const before = await snapshotOf(store, 'outage-shred');

    expect(await keys.shred('outage-b')).toBe(1);
    const err = await resume('outage-shred', resumeOpts(store, checkpoints)).then(
      (plan) => plan,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(UnavailableError);
    expect((err as Error).message).toMatch(/does not exist \(shredded/);
    expect(await snapshotOf(store, 'outage-shred')).toEqual(before);
    expect(before.status).toBe('implementing');
    expect(await heldLeases('outage-shred')).toEqual([]);
  });
});

describe('resume writes nothing before it owns the task (issue 14.6)', () => {
  const checkpoints = () => createCheckpointer({ db: tdb.db, keyRing: ring });

  /** A task whose newest checkpoint's snapshot lost a byte: resume would audit a fallback. */
  async function seedCorrupt(taskId: string) {
    const cps = checkpoints();
    const store = createTaskStore({ db: tdb.db, checkpointer: cps });
    await seedPlannedTask(store, taskId);
    const [newest] = await cps.list(taskId);
    const snapshotId = newest!.checkpoint.state_snapshot_uri.split('/')[1]!;
    await tdb.db.transaction().execute(async (t) => {
      await sql`SET LOCAL session_replication_role = replica`.execute(t); // past the immutability trigger
      await sql`UPDATE checkpoint_snapshot SET bytes = overlay(bytes placing '#'::bytea from 20 for 1)
                 WHERE snapshot_id = ${snapshotId}::uuid`.execute(t);
    });
    return { store, cps };
  }

  it('while a live worker holds the lease, resume throws LeaseHeldError and writes nothing (no fallback audit, no budget re-reservation)', async () => {
    const { store, cps } = await seedCorrupt('held-1');
    const leases = createLeaseManager({ db: tdb.db });
    const live = await leases.acquire({ taskId: 'held-1', branch: 'main', agentId: 'live', ttlMs: 60_000 });
    if (!live.ok) throw new Error('the live worker should get the lease');
    const before = await snapshotOf(store, 'held-1');

    await expect(
      resume(
        'held-1',
        resumeOpts(store, cps, {
          policy: async (): Promise<Policy> => ({ version: 'policy-2', allowed: true, budgetLimitUsd: 10 }),
        }),
      ),
    ).rejects.toThrow(LeaseHeldError);
    expect(await snapshotOf(store, 'held-1')).toEqual(before);
    expect((await store.get('held-1'))!.budget.currency_committed_usd).toBe(100);
    // The live worker still owns the task, with the same token.
    expect(await heldLeases('held-1')).toEqual([{ holder: 'live', fencing_token: live.fencingToken }]);
    expect((await leases.renew(live, 60_000)).ok).toBe(true);
  });

  it('a resume paused past its lease is refused by the fence once a new owner holds the task: nothing written', async () => {
    const { store, cps } = await seedCorrupt('slow-resume');
    const leases = createLeaseManager({ db: tdb.db });
    // Pause the resumer where it reads the policy: after it took the lease, before any write.
    let paused = false;
    let unpause!: () => void;
    const gate = new Promise<void>((r) => {
      unpause = r;
    });
    const slow = resume(
      'slow-resume',
      resumeOpts(store, cps, {
        leaseTtlMs: 500,
        agentId: 'slow-resumer',
        policy: async (): Promise<Policy> => {
          paused = true;
          await gate;
          return { version: 'policy-2', allowed: true, budgetLimitUsd: 10 };
        },
      }),
    ).then(
      (plan) => plan,
      (e: unknown) => e,
    );
    await waitFor('the resumer to pause at the policy read', () => paused, 30_000);
    await waitForLeaseExpiry(tdb.db, 'slow-resume', 'main');

    // A new owner takes the task; it has not written yet, so only the fence can refuse the resumer.
    const owner = await leases.acquire({
      taskId: 'slow-resume',
      branch: 'main',
      agentId: 'new-owner',
      ttlMs: 60_000,
    });
    if (!owner.ok) throw new Error('the new owner should get the expired lease');
    const before = await snapshotOf(store, 'slow-resume');

    unpause();
    const outcome = await slow;
    expect(outcome).toBeInstanceOf(LeaseLostError);
    expect(await snapshotOf(store, 'slow-resume')).toEqual(before);
    expect((await store.history('slow-resume')).filter((h) => h.actor === RESUMER)).toEqual([]);
    expect((await store.get('slow-resume'))!.budget.currency_committed_usd).toBe(100);
    // The new owner still holds the task (the resumer's release did not free it) and writes.
    expect(await heldLeases('slow-resume')).toEqual([
      { holder: 'new-owner', fencing_token: owner.fencingToken },
    ]);
    const w = await store.update({
      taskId: 'slow-resume',
      expectedVersion: before.version,
      patch: { active_agents: ['new-owner'] },
      actor: AGENT,
      lease: owner,
    });
    expect(w.ok).toBe(true);
  });
});
