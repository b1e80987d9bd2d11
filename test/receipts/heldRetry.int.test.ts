/**
 * A task quarantined after a failover: "no new side effect can start for it" (migration 0007).
 * The guard is on INSERT into tool_receipt, while a retry takes an existing receipt back to
 * `started` with an UPDATE (a failed receipt, or an uncertain one under `onUncertain: 'retry'`).
 * It holds because runOnce always tries the INSERT first (ON CONFLICT DO NOTHING): the BEFORE
 * INSERT trigger refuses before the conflict is found. These tests keep that so.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CairnErrorCodes } from '../../src/errors.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import type { RunOnceInput } from '../../src/receipts/types.js';
import { quarantine, releaseQuarantine } from '../../src/recovery/quarantine.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase('held_retry');
});
afterAll(async () => {
  await t?.drop();
});

/** A deploy that records each call; throws what `fail` returns; never returns while `hang` waits. */
function deploy(
  taskId: string,
  calls: string[],
  fail?: () => Error | undefined,
  hang?: Promise<void>,
): RunOnceInput<{ ok: true }> {
  return {
    taskId,
    step: 'deploy',
    tool: 'deployer',
    args: { env: 'demo' },
    onUncertain: 'retry',
    idempotentTool: true,
    effect: async ({ idempotencyKey }) => {
      calls.push(idempotencyKey);
      if (hang) await hang;
      const err = fail?.();
      if (err) throw err;
      return { ok: true };
    },
  };
}

describe('a quarantined task: no retry starts a side effect', () => {
  it('a failed receipt is not taken back for another attempt while the task is held; after the release it is', async () => {
    await createTaskStore({ db: t.db }).create({ task: newTask('HR-1'), actor: AGENT });
    const store = createReceiptStore({ db: t.db, worker: 'w1' });
    const calls: string[] = [];
    let first = true;
    const failOnce = () => {
      if (!first) return undefined;
      first = false;
      return Object.assign(new Error('the deploy API said no'), { retriable: false });
    };
    await store.runOnce(deploy('HR-1', calls, failOnce)).catch(() => {});
    expect((await store.byTask('HR-1')).map((r) => r.status)).toEqual(['failed']);

    await quarantine(t.db, ['HR-1'], { reason: 'lost work in a failover', actor: 'test' });
    await expect(store.runOnce(deploy('HR-1', calls))).rejects.toMatchObject({
      code: CairnErrorCodes.Quarantined,
    });
    expect(calls).toHaveLength(1);
    expect((await store.byTask('HR-1')).map((r) => [r.status, r.attempt])).toEqual([['failed', 1]]);

    await releaseQuarantine(t.db, 'HR-1', 'test');
    expect((await store.runOnce(deploy('HR-1', calls))).status).toBe('succeeded');
    expect(calls).toHaveLength(2);
  });

  it('an uncertain receipt under onUncertain "retry" is not run again while the task is held', async () => {
    await createTaskStore({ db: t.db }).create({ task: newTask('HR-2'), actor: AGENT });
    const calls: string[] = [];
    const store = createReceiptStore({ db: t.db, worker: 'w2' });
    // A worker that died inside the call: its receipt stays started; resume leaves it uncertain for a retry.
    void createReceiptStore({ db: t.db, worker: 'gone' })
      .runOnce(deploy('HR-2', calls, () => undefined, new Promise<void>(() => {})))
      .catch(() => {});
    while (calls.length === 0) await new Promise((r) => setTimeout(r, 5));
    await t.db
      .updateTable('tool_receipt')
      .set({ status: 'uncertain' })
      .where('task_id', '=', 'HR-2')
      .execute();
    const before = calls.length;

    await quarantine(t.db, ['HR-2'], { reason: 'lost work in a failover', actor: 'test' });
    await expect(store.runOnce(deploy('HR-2', calls))).rejects.toMatchObject({
      code: CairnErrorCodes.Quarantined,
    });
    expect(calls).toHaveLength(before);
    expect((await store.byTask('HR-2')).map((r) => r.status)).toEqual(['uncertain']);
  });
});
