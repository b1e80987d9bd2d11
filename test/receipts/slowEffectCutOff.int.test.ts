/**
 * adversary5: 0c606a5 turns an effect cut off (timeout, reset, OutcomeUnknownError) into
 * 'uncertain' and resolves it at once in execute() -> resolveUncertain(). c2c0901 fenced that
 * resolution in reconcile(), but not here: a worker paused past its lease whose effect then
 * times out gates, or claims for compensation, a receipt of a task another worker now holds.
 * - gate: the receipt is gated, then the gate's fenced audit row is refused: a gated receipt
 *   with no "human decision required" row in the task's history.
 * - compensate: the receipt is claimed 'compensating' by the non-holder, whose compensation
 *   is then refused at its intent (fence): the receipt stays 'compensating' for good, and the
 *   new holder (policy gate / reconcile without compensators) is told 'in_progress' forever.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { OutcomeUnknownError } from '../../src/errors.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { seedPlannedTask } from '../checkpoints/fixtures.js';
import { waitForLeaseExpiry } from '../support/leases.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
let store: TaskStore;
beforeAll(async () => {
  t = await createTestDatabase('adv5_slow_cutoff');
  store = createTaskStore({ db: t.db, checkpointer: createCheckpointer({ db: t.db }) });
});
afterAll(async () => {
  await t?.drop();
});

/** Lease for w1; the effect is slow past it (a new owner takes the task), then times out. */
async function slowCutOff(taskId: string, policy: 'gate' | 'compensate') {
  await seedPlannedTask(store, taskId);
  const leases = createLeaseManager({ db: t.db });
  const w1 = await leases.acquire({ taskId, branch: 'main', agentId: 'w1', ttlMs: 300 });
  if (!w1.ok) throw new Error('w1 lease');
  let owner: Awaited<ReturnType<typeof leases.acquire>> | undefined;
  const compensations: string[] = [];
  const receipts = createReceiptStore({ db: t.db, worker: 'w1' });
  const outcome = await receipts
    .runOnce({
      taskId,
      step: 'deploy',
      tool: 'deploy',
      args: { v: 1 },
      lease: w1,
      onUncertain: policy,
      ...(policy === 'compensate'
        ? { compensate: async () => void compensations.push('rollback by w1') }
        : { gate: { store, actor: 'spiffe://acme.example/agents/w1', lease: w1 } }),
      effect: async () => {
        // Paused (GC, SIGSTOP, a slow call) past the lease; a new owner takes the task.
        await waitForLeaseExpiry(t.db, taskId, 'main');
        owner = await leases.acquire({ taskId, branch: 'main', agentId: 'w2', ttlMs: 60_000 });
        throw new OutcomeUnknownError('deploy API: request timed out after it was sent');
      },
    })
    .then(
      (r) => r.status,
      (e: Error) => `${e.name}: ${e.message}`,
    );
  if (!owner?.ok) throw new Error('w2 should get the lease');
  const receipt = await t.db
    .selectFrom('tool_receipt')
    .select(['status', 'worker'])
    .where('task_id', '=', taskId)
    .where('step', '=', 'deploy')
    .executeTakeFirstOrThrow();
  return { outcome, receipt, compensations, owner, receipts };
}

it('gate: a worker that lost its lease does not gate the receipt without its audit row', async () => {
  const { outcome, receipt } = await slowCutOff('adv5-gate', 'gate');
  const history = await store.history('adv5-gate');
  const gateRows = history.filter((h) => /human decision required/.test(h.reason ?? '')).length;
  // Either the receipt is left uncertain for the holder, or it is gated with its audit row.
  const consistent = receipt.status !== 'gated' || gateRows === 1;
  expect({ outcome, receipt: receipt.status, gateRows, consistent }).toEqual({
    outcome: expect.anything(),
    receipt: expect.anything(),
    gateRows: expect.anything(),
    consistent: true,
  });
});

it('compensate: a worker that lost its lease leaves no receipt stuck compensating for the new holder', async () => {
  const { receipt, compensations, owner } = await slowCutOff('adv5-comp', 'compensate');
  if (!owner.ok) throw new Error('unreachable');
  // The new holder looks at the receipt with a gate policy (no compensator at hand).
  const holder = createReceiptStore({ db: t.db, worker: 'w2' });
  const seen = await holder.runOnce({
    taskId: 'adv5-comp',
    step: 'deploy',
    tool: 'deploy',
    args: { v: 1 },
    lease: owner,
    onUncertain: 'gate',
    gate: { store, actor: 'spiffe://acme.example/agents/w2', lease: owner },
    effect: async () => 'must not run',
  });
  const reconciled = await holder.reconcile('adv5-comp', {
    gate: { store, actor: 'spiffe://acme.example/agents/w2', lease: owner },
  });
  expect({
    compensations,
    stuck: receipt.status === 'compensating' && receipt.worker === 'w1',
    holderSees: seen.status,
    reconcile: reconciled.map((r) => r.action),
  }).toEqual({
    compensations: [],
    stuck: false,
    holderSees: 'gated',
    reconcile: ['settled'],
  });
});
