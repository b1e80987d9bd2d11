import { expect } from 'vitest';
import type { Db } from '../../src/db/database.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createReceiptStoreWithTestHooks } from '../../src/receipts/receipts.js';
import { waitForLeaseExpiry } from '../support/leases.js';

/**
 * A worker that took the task's lease, wrote its receipt's intent for the `deploy` step and
 * died (SIGKILLed after its intent, as a hook): the receipt is left 'started', its lease run out.
 */
export async function deadWorkersDeploy(db: Db, taskId: string, abandonAfterMs?: number): Promise<void> {
  const w0 = await createLeaseManager({ db }).acquire({ taskId, branch: 'main', agentId: 'w0', ttlMs: 200 });
  if (!w0.ok) throw new Error('w0 lease');
  const dying = createReceiptStoreWithTestHooks(
    { db, ...(abandonAfterMs !== undefined ? { abandonAfterMs } : {}) },
    {
      afterIntent: () => {
        throw new Error('w0 is SIGKILLed after its intent');
      },
    },
  );
  await expect(
    dying.runOnce({
      taskId,
      step: 'deploy',
      tool: 'deploy',
      args: { v: 1 },
      onUncertain: 'gate',
      lease: w0,
      effect: async () => 'deployed',
    }),
  ).rejects.toThrow('SIGKILLed');
  await waitForLeaseExpiry(db, taskId, 'main');
}
