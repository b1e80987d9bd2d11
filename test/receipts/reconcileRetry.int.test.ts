/**
 * resume() settled every receipt a dead worker left started by compensating or gating it. For a
 * tool whose own API applies an idempotency key once, the worker declares it (`idempotentTool`,
 * `onUncertain: 'retry'`), but the receipt row does not say so: resume gated it, and the task
 * waited for a human although its worker would have run it again safely (the failover harness
 * saw a deploy a tester was frozen in gated in region B, the task never completing). The
 * caller of resume now declares such tools too (`idempotentTools`).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CairnErrorCodes } from '../../src/errors.js';
import { createReceiptStore, createReceiptStoreWithTestHooks } from '../../src/receipts/receipts.js';
import type { RunOnceInput } from '../../src/receipts/types.js';
import { quarantine } from '../../src/recovery/quarantine.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase('reconcile_retry');
});
afterAll(async () => {
  await t?.drop();
});

/** A deploy whose effect records the key it was given; `hang` keeps the first call from returning. */
function deploy(taskId: string, keys: string[], hang?: Promise<void>): RunOnceInput<{ applied: string }> {
  return {
    taskId,
    step: 'deploy',
    tool: 'deployer',
    args: { env: 'demo' },
    onUncertain: 'retry',
    idempotentTool: true,
    effect: async ({ idempotencyKey }) => {
      keys.push(idempotencyKey);
      if (hang) await hang;
      return { applied: idempotencyKey };
    },
  };
}

/** A worker that starts the deploy and stops answering inside it (frozen, or dead): its receipt stays started. */
async function startedByAFrozenWorker(taskId: string, keys: string[]) {
  await createTaskStore({ db: t.db }).create({ task: newTask(taskId), actor: AGENT });
  let wake!: () => void;
  const frozen = createReceiptStore({ db: t.db, worker: 'frozen' });
  const late = frozen.runOnce(deploy(taskId, keys, new Promise<void>((r) => (wake = r))));
  while (keys.length === 0) await new Promise((r) => setTimeout(r, 5));
  await new Promise((r) => setTimeout(r, 20)); // older than the resumer's abandonAfterMs
  return { late, wake };
}

describe('reconcile with idempotentTools', () => {
  it('leaves a dead worker’s receipt of an idempotent tool uncertain; the next runOnce runs it with the same key; the frozen worker waking changes nothing', async () => {
    const keys: string[] = [];
    const { late, wake } = await startedByAFrozenWorker('RR-1', keys);
    const resumer = createReceiptStore({ db: t.db, worker: 'resumer', abandonAfterMs: 10 });
    const done = await resumer.reconcile('RR-1', { idempotentTools: ['deployer'] });
    expect(done.map((d) => d.action)).toEqual(['retry']);
    expect((await resumer.byTask('RR-1')).map((r) => r.status)).toEqual(['uncertain']);

    const again = await resumer.runOnce(deploy('RR-1', keys));
    expect(again.status).toBe('succeeded');
    expect(keys).toHaveLength(2);
    expect(keys[1]).toBe(keys[0]); // the same key: the tool applies it once

    wake(); // the frozen worker finishes what it started
    // It is told the receipt's outcome; its own result is not recorded over the retry's.
    expect(await late).toMatchObject({ status: 'succeeded', ran: false });
    const [row] = await resumer.byTask('RR-1');
    expect(row).toMatchObject({ status: 'succeeded', worker: 'resumer' });
    // Reconciled again (an operator running resume twice): nothing left to settle.
    expect((await resumer.reconcile('RR-1', { idempotentTools: ['deployer'] })).map((d) => d.action)).toEqual(
      ['skip'],
    );
  });

  it('does not mark uncertain (nor gate) the new attempt of a live worker that took the receipt back after reconcile found its owner gone', async () => {
    const keys: string[] = [];
    const frozen = await startedByAFrozenWorker('RR-4', keys);
    let finish!: () => void;
    const running = new Promise<void>((r) => (finish = r));
    let live: Promise<unknown> | undefined;
    const resumer = createReceiptStoreWithTestHooks(
      { db: t.db, worker: 'resumer', abandonAfterMs: 10 },
      {
        // Between reconcile's look at the owner and its mark: a live worker takes the receipt
        // back (attempt 2) and its effect is running.
        afterOwnerGone: async () => {
          const w2 = createReceiptStore({ db: t.db, worker: 'w2', abandonAfterMs: 10 });
          live = w2.runOnce(deploy('RR-4', keys, running));
          while (keys.length < 2) await new Promise((r) => setTimeout(r, 5));
        },
      },
    );
    const done = await resumer.reconcile('RR-4', {});
    expect(done.map((d) => d.action)).toEqual(['in_progress']);
    expect((await resumer.byTask('RR-4'))[0]).toMatchObject({ status: 'started', attempt: 2, worker: 'w2' });
    finish();
    expect(await live).toMatchObject({ status: 'succeeded' });
    frozen.wake();
    await frozen.late.catch(() => {});
    expect((await resumer.byTask('RR-4'))[0]).toMatchObject({ status: 'succeeded', attempt: 2 });
  });

  it('gates, not leaves for a retry, a receipt whose compensation was tried and failed (the effect was meant to be undone)', async () => {
    const keys: string[] = [];
    const frozen = await startedByAFrozenWorker('RR-5', keys);
    const resumer = createReceiptStore({ db: t.db, worker: 'resumer', abandonAfterMs: 10 });
    const failedUndo = await resumer.reconcile('RR-5', {
      compensators: {
        deployer: async () => {
          throw new Error('the undo API refused');
        },
      },
    });
    // The plan says gated, and so does the receipt: no worker's retry runs what was to be undone.
    expect(failedUndo.map((d) => d.action)).toEqual(['gated']);
    expect((await resumer.byTask('RR-5')).find((r) => r.step === 'deploy')?.status).toBe('gated');
    const next = await resumer.reconcile('RR-5', { idempotentTools: ['deployer'] });
    expect(next.map((d) => d.action)).toEqual(['settled']);
    const retried = await resumer.runOnce(deploy('RR-5', keys));
    expect(retried.status).toBe('gated');
    expect(keys).toHaveLength(1); // the frozen worker's call only
    frozen.wake();
    await frozen.late.catch(() => {});
  });

  it('a worker’s retry does not run an effect whose compensation was tried and failed, wherever the receipt went back to uncertain', async () => {
    const keys: string[] = [];
    const frozen = await startedByAFrozenWorker('RR-8', keys);
    const w2 = createReceiptStore({ db: t.db, worker: 'w2', abandonAfterMs: 10 });
    // A worker whose policy is to compensate: its undo fails, the receipt is uncertain again.
    const undo = await w2.runOnce({
      ...deploy('RR-8', keys),
      onUncertain: 'compensate',
      compensate: async () => {
        throw new Error('the undo API refused');
      },
    });
    expect(undo.status).toBe('failed');
    expect((await w2.byTask('RR-8')).find((r) => r.step === 'deploy')?.status).toBe('uncertain');
    const retried = await w2.runOnce(deploy('RR-8', keys));
    expect(retried.status).toBe('gated');
    expect(keys).toHaveLength(1);
    frozen.wake();
    await frozen.late.catch(() => {});
  });

  it('settles the attempt its worker left uncertain itself (woken, its effect cut off) between reconcile’s look at the owner and its mark', async () => {
    const keys: string[] = [];
    const frozen = await startedByAFrozenWorker('RR-6', keys);
    let undone = 0;
    const resumer = createReceiptStoreWithTestHooks(
      { db: t.db, worker: 'resumer', abandonAfterMs: 10 },
      {
        afterOwnerGone: async (id) => {
          await t.db
            .updateTable('tool_receipt')
            .set({ status: 'uncertain' })
            .where('receipt_id', '=', id)
            .where('attempt', '=', 1)
            .execute();
        },
      },
    );
    const done = await resumer.reconcile('RR-6', {
      compensators: {
        deployer: async () => {
          undone++;
        },
      },
    });
    expect(done.map((d) => d.action)).toEqual(['compensated']);
    expect(undone).toBe(1);
    frozen.wake();
    await frozen.late.catch(() => {});
  });

  it('changes nothing of a task held between reconcile’s look at the owner and its mark (a failover check holding it meanwhile)', async () => {
    const keys: string[] = [];
    const frozen = await startedByAFrozenWorker('RR-7', keys);
    const resumer = createReceiptStoreWithTestHooks(
      { db: t.db, worker: 'resumer', abandonAfterMs: 10 },
      {
        afterOwnerGone: async () => {
          await quarantine(t.db, ['RR-7'], { reason: 'failover: lost work', actor: 'op' });
        },
      },
    );
    await expect(resumer.reconcile('RR-7', {})).rejects.toMatchObject({ code: CairnErrorCodes.Quarantined });
    expect((await resumer.byTask('RR-7')).map((r) => r.status)).toEqual(['started']);
    frozen.wake();
    await frozen.late.catch(() => {});
  });

  it('gates it without the declaration, and compensates it when a compensator for the tool is given as well', async () => {
    const gatedKeys: string[] = [];
    const gated = await startedByAFrozenWorker('RR-2', gatedKeys);
    const resumer = createReceiptStore({ db: t.db, worker: 'resumer', abandonAfterMs: 10 });
    expect((await resumer.reconcile('RR-2', {})).map((d) => d.action)).toEqual(['gated']);
    expect((await resumer.reconcile('RR-2', { idempotentTools: ['other'] })).map((d) => d.action)).toEqual([
      'settled',
    ]);

    const keys: string[] = [];
    const compensated = await startedByAFrozenWorker('RR-3', keys);
    let undone = 0;
    const done = await resumer.reconcile('RR-3', {
      idempotentTools: ['deployer'],
      compensators: {
        deployer: async () => {
          undone++;
        },
      },
    });
    expect(done.map((d) => d.action)).toEqual(['compensated']);
    expect(undone).toBe(1);
    gated.wake();
    compensated.wake();
    await Promise.allSettled([gated.late, compensated.late]);
  });

  it('a compensation that fails after the task was held meanwhile leaves the receipt uncertain, not gated without its audit row', async () => {
    const keys: string[] = [];
    const frozen = await startedByAFrozenWorker('RR-9', keys);
    const resumer = createReceiptStore({ db: t.db, worker: 'resumer', abandonAfterMs: 10 });
    await expect(
      resumer.reconcile('RR-9', {
        compensators: {
          deployer: async () => {
            await quarantine(t.db, ['RR-9'], { reason: 'failover: lost work', actor: 'op' });
            throw new Error('the undo API refused');
          },
        },
      }),
    ).rejects.toMatchObject({ code: CairnErrorCodes.Quarantined });
    expect((await resumer.byTask('RR-9')).find((r) => r.step === 'deploy')?.status).toBe('uncertain');
    frozen.wake();
    await frozen.late.catch(() => {});
  });
});
