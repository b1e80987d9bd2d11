import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { LeaseLostError } from '../../src/errors.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createReceiptStoreWithTestHooks } from '../../src/receipts/receipts.js';
import { resume } from '../../src/recovery/resume.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { resumeOptions, seedPlannedTask } from '../checkpoints/fixtures.js';
import { waitForLeaseExpiry } from '../support/leases.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

/**
 * Checkpoint-then-effect with a slow worker: W1 commits its intent and the checkpoint taken
 * before an irreversible effect, then freezes past its lease; a resumer takes the task over
 * and settles the receipt (gated: nobody can know whether the effect ran); W1 wakes up and
 * must not start the effect it no longer owns.
 */
let tdb: TestDatabase;

beforeAll(async () => {
  tdb = await createTestDatabase('checkpoint_then_effect');
});
afterAll(async () => {
  await tdb?.drop();
});

describe('checkpoint, then an irreversible effect', () => {
  it('a worker frozen after its intent and checkpoint, past its lease, does not start the effect once a resumer owns the task', async () => {
    const checkpoints = createCheckpointer({ db: tdb.db });
    const store = createTaskStore({ db: tdb.db, checkpointer: checkpoints, cacheSize: 0 });
    await seedPlannedTask(store, 'cte-1');
    const leases = createLeaseManager({ db: tdb.db });
    const lease = await leases.acquire({ taskId: 'cte-1', branch: 'main', agentId: 'w1', ttlMs: 1000 });
    if (!lease.ok) throw new Error('w1 could not take the lease');

    let reached!: () => void;
    const frozen = new Promise<void>((r) => {
      reached = r;
    });
    let wake!: () => void;
    const woken = new Promise<void>((r) => {
      wake = r;
    });
    let effects = 0;
    const w1 = createReceiptStoreWithTestHooks(
      {
        db: tdb.db,
        checkpointer: checkpoints,
      },
      {
        afterIntent: async () => {
          reached();
          await woken; // frozen: intent and checkpoint committed, effect not started
        },
      },
    )
      .runOnce({
        taskId: 'cte-1',
        step: 'deploy',
        tool: 'deployer',
        args: { v: 1 },
        lease,
        irreversible: true,
        onUncertain: 'gate',
        effect: async () => {
          effects++;
          return 'deployed';
        },
      })
      .then(
        (r) => r,
        (e: Error) => e,
      );
    await frozen;
    const before = await checkpoints.list('cte-1');
    expect(before[0]!.checkpoint.reason).toMatch(/before irreversible effect: deployer at deploy/);
    await waitForLeaseExpiry(tdb.db, 'cte-1', 'main');

    const plan = await resume('cte-1', resumeOptions({ db: tdb.db, store, checkpoints }));
    expect(plan.outcome).toBe('resumed');
    expect(plan.receipts).toMatchObject([{ tool: 'deployer', action: 'gated' }]);

    wake();
    const late = await w1;
    expect(late).toBeInstanceOf(LeaseLostError);
    expect(effects).toBe(0);
    await waitFor('the receipt to stay gated for a human', async () => {
      const r = await tdb.db
        .selectFrom('tool_receipt')
        .select('status')
        .where('task_id', '=', 'cte-1')
        .where('step', '=', 'deploy')
        .executeTakeFirstOrThrow();
      return r.status === 'gated';
    });
  });
});
