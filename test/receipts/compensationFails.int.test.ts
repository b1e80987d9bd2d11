import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createReceiptStore, createReceiptStoreWithTestHooks } from '../../src/receipts/receipts.js';
import type { RunOnceInput } from '../../src/receipts/types.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

/**
 * A compensation that fails leaves its receipt uncertain again (not stuck in compensating),
 * so a later call can compensate it: found in review, the transition was missing.
 */
let tdb: TestDatabase;
beforeAll(async () => {
  tdb = await createTestDatabase('compensation_fails');
});
afterAll(async () => {
  await tdb?.drop();
});

describe('a compensation that fails', () => {
  it('returns the receipt to uncertain; the next call compensates it once', async () => {
    // A worker that "died" after its intent: no lease, abandoned after 1 ms.
    const store = createReceiptStore({ db: tdb.db, abandonAfterMs: 1 });
    const input = (compensate: () => Promise<unknown>): RunOnceInput<string> => ({
      taskId: 'cf-1',
      step: 'deploy',
      tool: 'deployer',
      args: {},
      onUncertain: 'compensate',
      compensate,
      effect: async () => {
        throw new Error('must not run again');
      },
    });
    const dead = createReceiptStoreWithTestHooks(
      {
        db: tdb.db,
      },
      {
        afterIntent: () => {
          throw new Error('worker died after its intent');
        },
      },
    );
    await expect(dead.runOnce(input(async () => 'x'))).rejects.toThrow(/worker died/);
    await waitFor('the receipt to be abandoned by the database clock', async () => {
      const r = await tdb.db
        .selectFrom('tool_receipt')
        .select('status')
        .where('step', '=', 'deploy')
        .execute();
      return r[0]?.status === 'started';
    });

    const first = await store.runOnce(
      input(async () => {
        throw new Error('undo endpoint down');
      }),
    );
    expect(first.status).toBe('failed');
    const after = await tdb.db
      .selectFrom('tool_receipt')
      .select('status')
      .where('step', '=', 'deploy')
      .executeTakeFirstOrThrow();
    expect(after.status).toBe('uncertain');

    let undone = 0;
    const second = await store.runOnce(
      input(async () => {
        undone++;
        return 'undone';
      }),
    );
    expect(second.status).toBe('compensated');
    expect(undone).toBe(1);
  });
});
