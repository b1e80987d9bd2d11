/**
 * Review: reconcile looked at its fence once, before asking whether a receipt's worker is
 * alive. A reconcile paused after that (the afterOwnerGone hook here) past its lease, while a
 * new owner took the task, then gated the receipt (its audit row refused by the fence after
 * the receipt moved: gated with no audit row) or claimed it for compensation (the compensation
 * then refused at its intent: compensating for good). And a gate whose audit write met another
 * write to the task returned `gated` with no audit row.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LeaseLostError } from '../../src/errors.js';
import { createLeaseManager, type Lease } from '../../src/leases/leases.js';
import { createReceiptStore, createReceiptStoreWithTestHooks } from '../../src/receipts/receipts.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { waitForLeaseExpiry } from '../support/leases.js';
import { pausePoint } from '../support/pausePoint.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { deadWorkersDeploy } from './deadWorker.js';

let t: TestDatabase;
let store: TaskStore;
beforeAll(async () => {
  t = await createTestDatabase('reconcile_after_owner_gone');
  store = createTaskStore({ db: t.db, cacheSize: 0 });
});
afterAll(async () => {
  await t?.drop();
});

const leases = () => createLeaseManager({ db: t.db });

/** A task whose receipt a dead worker left 'started' (its lease run out). */
async function deadWorkersReceipt(taskId: string) {
  await store.create({ task: newTask(taskId), actor: AGENT });
  await deadWorkersDeploy(t.db, taskId, 100);
}

/** A resumer's lease, and a receipt store that pauses (after finding the worker gone, or after claiming the receipt for compensation) until a new owner holds the task. */
async function slowReconciler(
  taskId: string,
  at: 'afterOwnerGone' | 'afterCompensationClaim' = 'afterOwnerGone',
): Promise<{ lease: Lease; receipts: ReturnType<typeof createReceiptStore> }> {
  const lease = await leases().acquire({ taskId, branch: 'main', agentId: 'resumer', ttlMs: 300 });
  if (!lease.ok) throw new Error('resumer lease');
  const receipts = createReceiptStoreWithTestHooks(
    { db: t.db, abandonAfterMs: 100 },
    {
      [at]: async () => {
        await waitForLeaseExpiry(t.db, taskId, 'main');
        const owner = await leases().acquire({ taskId, branch: 'main', agentId: 'new-owner', ttlMs: 60_000 });
        if (!owner.ok) throw new Error('the new owner should get the lease');
      },
    },
  );
  return { lease, receipts };
}

const statusOf = async (taskId: string) =>
  (
    await t.db
      .selectFrom('tool_receipt')
      .select('status')
      .where('task_id', '=', taskId)
      .where('step', '=', 'deploy')
      .executeTakeFirstOrThrow()
  ).status;

describe('reconcile paused past its lease after finding the worker gone', () => {
  it('does not gate the receipt: LeaseLostError, left uncertain for the holder, the audit log unchanged', async () => {
    await deadWorkersReceipt('gone-gate');
    const before = (await store.history('gone-gate')).length;
    const { lease, receipts } = await slowReconciler('gone-gate');
    const outcome = await receipts
      .reconcile('gone-gate', { gate: { store, actor: AGENT, lease } })
      .catch((e: unknown) => e);
    expect(outcome).toBeInstanceOf(LeaseLostError);
    expect(['started', 'uncertain']).toContain(await statusOf('gone-gate'));
    expect((await store.history('gone-gate')).length).toBe(before);
  });

  // The second pause point, after review of the fix: the claim was fenced, the compensation's
  // start was not looked at again: refused at its intent, it left the receipt compensating for good.
  it.each([
    ['after finding the worker gone: claims nothing', 'gone-comp', 'afterOwnerGone'],
    ['after claiming the receipt: gives the claim back', 'claimed-comp', 'afterCompensationClaim'],
  ] as const)(
    'runs no compensation when paused %s; LeaseLostError, the receipt uncertain for the holder',
    async (_, taskId, at) => {
      await deadWorkersReceipt(taskId);
      const { lease, receipts } = await slowReconciler(taskId, at);
      const undone: string[] = [];
      const outcome = await receipts
        .reconcile(taskId, {
          lease,
          compensators: {
            deploy: async () => {
              undone.push('rolled back');
              return 'rolled back';
            },
          },
        })
        .catch((e: unknown) => e);
      expect(outcome).toBeInstanceOf(LeaseLostError);
      expect(undone).toEqual([]);
      // After finding the worker gone the mark may or may not have been written; after a claim, given back.
      expect(at === 'afterOwnerGone' ? ['started', 'uncertain'] : ['uncertain']).toContain(
        await statusOf(taskId),
      );
    },
  );
});

describe("a claim given back only while it is the claimer's to give", () => {
  // Review of the give-back: W1 paused after its claim, the new holder W2 continued that claim
  // (its compensation running), then W1 woke, was refused at its compensation's start and gave
  // the claim back: the receipt said "uncertain, not started" while W2's compensation ran.
  it("a slow claimer does not give back a claim the holder's compensation is running under", async () => {
    await deadWorkersReceipt('shared-claim');
    const w1Lease = await leases().acquire({
      taskId: 'shared-claim',
      branch: 'main',
      agentId: 'w1',
      ttlMs: 300,
    });
    if (!w1Lease.ok) throw new Error('w1 lease');
    const w1Paused = pausePoint();
    const w1 = createReceiptStoreWithTestHooks(
      { db: t.db, abandonAfterMs: 100, worker: 'w1' },
      { afterCompensationClaim: () => w1Paused.hold() },
    );
    const compensators = (during: () => Promise<void>) => ({
      deploy: async () => {
        await during();
        return 'rolled back';
      },
    });
    const w1Done = w1
      .reconcile('shared-claim', { lease: w1Lease, compensators: compensators(async () => {}) })
      .catch((e: unknown) => e);
    await w1Paused.reached;
    await waitForLeaseExpiry(t.db, 'shared-claim', 'main');
    const w2Lease = await leases().acquire({
      taskId: 'shared-claim',
      branch: 'main',
      agentId: 'w2',
      ttlMs: 60_000,
    });
    if (!w2Lease.ok) throw new Error('w2 lease');
    const w2Undoing = pausePoint();
    const w2Done = createReceiptStore({ db: t.db, abandonAfterMs: 100, worker: 'w2' }).reconcile(
      'shared-claim',
      {
        lease: w2Lease,
        compensators: compensators(() => w2Undoing.hold()),
      },
    );
    await w2Undoing.reached; // W2's compensation is running under W1's claim
    w1Paused.release();
    expect(await w1Done).toBeInstanceOf(LeaseLostError);
    expect(await statusOf('shared-claim')).toBe('compensating'); // not given back
    w2Undoing.release();
    expect(await w2Done).toMatchObject([{ action: 'compensated' }]);
    expect(await statusOf('shared-claim')).toBe('compensated');
  });
});

describe('a gate on a task that ended', () => {
  // Review of the fix: the audit write, refused for a task that ended, rolled the gate back and
  // left the receipt uncertain (open to a retry that runs the effect again).
  it('gates the receipt; the task, which never changes again, gets no audit row', async () => {
    await deadWorkersReceipt('ended-gate');
    const r = await store.update({
      taskId: 'ended-gate',
      expectedVersion: 1,
      actor: AGENT,
      patch: { status: 'cancelled' },
    });
    expect(r.ok).toBe(true);
    const before = (await store.history('ended-gate')).length;
    const out = await createReceiptStore({ db: t.db, abandonAfterMs: 100 }).reconcile('ended-gate', {
      gate: { store, actor: AGENT },
    });
    expect(out).toMatchObject([{ action: 'gated' }]);
    expect(await statusOf('ended-gate')).toBe('gated');
    expect((await store.history('ended-gate')).length).toBe(before);
  });
});

describe('a gate whose audit write meets another write to the task', () => {
  it('reads the task again and writes its audit row; never gated without one', async () => {
    await deadWorkersReceipt('gate-race');
    // Another writer takes the version the gate read: its first audit write is stale.
    let raced = false;
    const racing: TaskStore = {
      ...store,
      async get(id, opts) {
        const task = await store.get(id, opts);
        if (!raced && task) {
          raced = true;
          const r = await store.update({
            taskId: id,
            expectedVersion: task.version,
            actor: AGENT,
            patch: { artifacts: { review_report: 's3://other-writer' } } as never,
          });
          expect(r.ok).toBe(true);
        }
        return task;
      },
    };
    const r = await createReceiptStore({ db: t.db, abandonAfterMs: 100 }).reconcile('gate-race', {
      gate: { store: racing, actor: AGENT },
    });
    expect(r).toMatchObject([{ action: 'gated' }]);
    expect(await statusOf('gate-race')).toBe('gated');
    const reasons = (await store.history('gate-race')).map((h) => h.reason ?? '');
    expect(reasons.some((x) => x.startsWith('human decision required'))).toBe(true);
  });
});
