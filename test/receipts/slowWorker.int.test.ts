/**
 * Issue 14.7: a worker that was slow, not dead. Its lease lapses mid-effect, a second worker
 * takes the receipt for compensation, and then the first one's effect returns. The world now
 * holds the effect and its undoing in an order nobody knows, so the receipt must end gated
 * with the conflict named (a human decides), never `succeeded`.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLeaseManager, type Lease } from '../../src/leases/leases.js';
import { createReceiptStore, createReceiptStoreWithTestHooks } from '../../src/receipts/receipts.js';
import type { RunOnceInput } from '../../src/receipts/types.js';
import { callSink, type Sink, startSink } from '../support/effectSink.js';
import { waitForLeaseExpiry } from '../support/leases.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

let tdb: TestDatabase;
let sink: Sink;
beforeAll(async () => {
  tdb = await createTestDatabase('slow_worker');
  sink = await startSink();
});
afterAll(async () => {
  await sink?.close();
  await tdb?.drop();
});

/** A point where an actor stops until the test lets it go on. */
function pausePoint() {
  let reached = false;
  let release!: () => void;
  const released = new Promise<void>((r) => {
    release = r;
  });
  return {
    /** Called by the actor: marks the point reached and waits. */
    async here() {
      reached = true;
      await released;
    },
    reached: (what: string) => waitFor(what, () => reached, 30_000),
    release,
  };
}

const TASK = 'slow';
const CONFLICT =
  /(^|; )conflict: attempt 1 of deployer at .* reported success after the receipt was taken for compensation/;

/** The call both workers make: same task, step, tool and args, so the same idempotency key. */
function deploy(step: string, extra: Partial<RunOnceInput<unknown>>): RunOnceInput<unknown> {
  return {
    taskId: TASK,
    step,
    tool: 'deployer',
    args: { env: 'prod' },
    onUncertain: 'compensate',
    compensate: ({ idempotencyKey }) => callSink(sink.url, '/compensate', step, idempotencyKey),
    effect: ({ idempotencyKey }) => callSink(sink.url, '/apply', step, idempotencyKey),
    ...extra,
  };
}

/**
 * W1 takes a short lease and starts the effect: the sink applies it, then W1 freezes before
 * the effect returns. Its lease expires by the database clock. Returns W1's pending outcome.
 */
async function slowWorkerFrozenMidEffect(step: string) {
  const leases = createLeaseManager({ db: tdb.db });
  // Long enough to reach the effect on a busy machine (a lease lost first fences the effect
  // off, and there is no race to test); the pause point then holds W1 past it.
  const w1Lease = await leases.acquire({ taskId: TASK, branch: step, agentId: 'w1', ttlMs: 3000 });
  if (!w1Lease.ok) throw new Error('w1 should get the lease');
  const frozen = pausePoint();
  const w1 = createReceiptStore({ db: tdb.db }).runOnce(
    deploy(step, {
      lease: w1Lease,
      effect: async ({ idempotencyKey }) => {
        const result = await callSink(sink.url, '/apply', step, idempotencyKey);
        await frozen.here();
        return result;
      },
    }),
  );
  await frozen.reached('w1 to be frozen mid-effect');
  await waitForLeaseExpiry(tdb.db, TASK, step);
  const w2Lease = await leases.acquire({ taskId: TASK, branch: step, agentId: 'w2', ttlMs: 60_000 });
  if (!w2Lease.ok) throw new Error('w2 should get the expired lease');
  return { w1, unfreeze: frozen.release, w2Lease: w2Lease as Lease };
}

async function receiptOf(key: string) {
  const row = await createReceiptStore({ db: tdb.db }).byKey(key);
  return { status: row?.status, resolution: row?.resolution };
}

describe('a slow worker’s success races a compensation (issue 14.7)', () => {
  it('success reported after the compensation finished: the receipt is gated with the conflict, never succeeded', async () => {
    const { w1, unfreeze, w2Lease } = await slowWorkerFrozenMidEffect('deploy-a');

    const w2 = await createReceiptStore({ db: tdb.db }).runOnce(deploy('deploy-a', { lease: w2Lease }));
    expect(w2.status).toBe('compensated');

    unfreeze();
    const late = await w1;
    expect(late.status).toBe('gated');
    expect(await receiptOf(w2.idempotencyKey)).toEqual({
      status: 'gated',
      resolution: expect.stringMatching(CONFLICT),
    });
    // A later call for the same key is told the truth, and runs nothing.
    const again = await createReceiptStore({ db: tdb.db }).runOnce(
      deploy('deploy-a', {
        effect: async () => {
          throw new Error('must not run');
        },
      }),
    );
    expect(again).toMatchObject({ status: 'gated', receiptId: w2.receiptId });
    // The world holds both.
    expect(sink.applied.get(w2.idempotencyKey)).toBe(1);
    expect(sink.compensated.has(w2.idempotencyKey)).toBe(true);
  });

  it('success reported while the compensator is between its claim and the compensation: gated with the conflict, never succeeded', async () => {
    const { w1, unfreeze, w2Lease } = await slowWorkerFrozenMidEffect('deploy-b');
    const claimed = pausePoint();
    const w2Store = createReceiptStoreWithTestHooks({ db: tdb.db }, { afterCompensationClaim: claimed.here });
    const w2 = w2Store.runOnce(deploy('deploy-b', { lease: w2Lease }));
    await claimed.reached('w2 to claim the receipt for compensation');

    unfreeze();
    const late = await w1;
    expect(late.status).toBe('gated');
    claimed.release();
    const compensator = await w2;
    expect(compensator.status).toBe('gated');

    expect(await receiptOf(compensator.idempotencyKey)).toEqual({
      status: 'gated',
      resolution: expect.stringMatching(CONFLICT),
    });
    const again = await createReceiptStore({ db: tdb.db }).runOnce(
      deploy('deploy-b', {
        effect: async () => {
          throw new Error('must not run');
        },
      }),
    );
    expect(again).toMatchObject({ status: 'gated', receiptId: compensator.receiptId });
    // The effect stands, and nobody undid it: the compensator saw the conflict before acting.
    expect(sink.applied.get(compensator.idempotencyKey)).toBe(1);
    expect(sink.compensated.has(compensator.idempotencyKey)).toBe(false);
  });
});
