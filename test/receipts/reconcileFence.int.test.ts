/**
 * reconcile settles a task's uncertain receipts: compensates them (compensators) or gates them.
 * Resume fences it with its lease (through `gate.lease`); a caller that passes compensators
 * and no gate had no way to fence it, and a worker paused past its lease compensated the new
 * holder's receipts. `lease` fences it the same way.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LeaseLostError } from '../../src/errors.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase('reconcile_fence');
});
afterAll(async () => {
  await t?.drop();
});

describe('reconcile with compensators and a lease', () => {
  it('compensates nothing once the lease is lost; under a current lease it compensates', async () => {
    await createTaskStore({ db: t.db }).create({ task: newTask('R1'), actor: AGENT });
    const leases = createLeaseManager({ db: t.db });
    const w1 = await leases.acquire({ taskId: 'R1', branch: 'main', agentId: 'w1', ttlMs: 600_000 });
    if (!w1.ok) throw new Error('w1 lease');
    await sql`INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status, worker)
              VALUES (gen_random_uuid(), 'R1/pay', 'R1', 'pay', 'payments', 'sha256:aa', 'started', 'gone')`.execute(
      t.db,
    );
    await sql`UPDATE tool_receipt SET status = 'uncertain' WHERE idempotency_key = 'R1/pay'`.execute(t.db);
    let compensated = 0;
    const compensators = {
      payments: async () => {
        compensated++;
      },
    };
    const receipts = createReceiptStore({ db: t.db });
    // w1 pauses; its lease is taken over.
    await sql`UPDATE task_lease SET holder = 'w2', lease_id = gen_random_uuid(), fencing_token = fencing_token + 1
               WHERE task_id = 'R1'`.execute(t.db);
    await expect(receipts.reconcile('R1', { compensators, lease: w1 })).rejects.toThrow(LeaseLostError);
    expect(compensated).toBe(0);
    expect((await receipts.byTask('R1'))[0]?.status).toBe('uncertain');

    await sql`UPDATE task_lease SET expires_at = now() WHERE task_id = 'R1'`.execute(t.db);
    const w3 = await leases.acquire({ taskId: 'R1', branch: 'main', agentId: 'w3', ttlMs: 600_000 });
    if (!w3.ok) throw new Error('w3 lease');
    const done = await receipts.reconcile('R1', { compensators, lease: w3 });
    expect(done.map((d) => d.action)).toEqual(['compensated']);
    expect(compensated).toBe(1);
  });
});
