import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import type { Db } from '../../src/db/database.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { placeHold } from '../../src/retention/holds.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

/**
 * A legal hold keeps a task's data as it is: "held data is never deleted, even by hand" (the
 * LangGraph tables: "nothing deleted, nothing rewritten, by the saver or by hand"). The core
 * tables guard DELETE only, on task_state, task_audit, checkpoint, tool_receipt and
 * task_annotation: the tenant under the hold could still rewrite its receipts' results and
 * errors (UPDATE granted on those columns, same status allowed) and delete the task's outbox
 * rows with its own SQL. Migration 0015: a settled receipt never changes for a tenant's role,
 * and tenants delete no outbox row. (The task's lease rows are coordination, not data:
 * retention deletes them with the task, and a tenant may still release its own.)
 */
let t: TestDatabase;
let app: Db;
let asA: Db;
const OPERATOR = 'spiffe://acme.example/operators/dpo';

beforeAll(async () => {
  t = await createTestDatabase('adv3_held_rewrite');
  ({ app, asA } = await twoTenants(t, 2));
});
afterAll(async () => {
  await app?.destroy();
  await t?.drop();
});

describe('a task under legal hold, and the tenant it belongs to', () => {
  it('cannot rewrite its settled receipts nor delete its messages', async () => {
    const store = createTaskStore({ db: asA, checkpointer: createCheckpointer({ db: asA }) });
    await store.create({ task: newTask('held-1', { tenant_id: 'tenant-a' }), actor: AGENT });
    await createReceiptStore({ db: asA }).runOnce({
      taskId: 'held-1',
      step: 'pay',
      tool: 'payments.charge',
      args: { amount: 100 },
      onUncertain: 'gate',
      effect: async () => ({ charged: 100 }),
    });
    const lease = await createLeaseManager({ db: asA }).acquire({
      taskId: 'held-1',
      branch: 'main',
      agentId: 'w',
      ttlMs: 60_000,
    });
    expect(lease.ok).toBe(true);
    await store.update({
      taskId: 'held-1',
      expectedVersion: 1,
      patch: { status: 'cancelled' },
      actor: AGENT,
      messages: [{ topic: 'x', payload: { a: 1 } }],
    });
    await placeHold(t.db, { taskId: 'held-1', reason: 'litigation 2026-301', actor: OPERATOR });

    const tries = {
      receipt:
        await sql`UPDATE tool_receipt SET result = '{"charged": 0}', result_digest = 'sha256:00', error = 'never ran'
                         WHERE task_id = 'held-1'`
          .execute(asA)
          .then(
            (r) => Number(r.numAffectedRows),
            (e: Error) => e.message,
          ),
      outbox: await sql`DELETE FROM outbox WHERE task_id = 'held-1'`.execute(asA).then(
        (r) => Number(r.numAffectedRows),
        (e: Error) => e.message,
      ),
    };
    expect(tries).toMatchObject({
      receipt: expect.stringMatching(/is settled \(succeeded\): what it records never changes/),
      outbox: expect.stringMatching(/permission denied/),
    });
  });

  it("cannot rewrite a settled receipt's fence, nor a gated one's record; it may only add to a gate's resolution", async () => {
    const store = createTaskStore({ db: asA });
    await store.create({ task: newTask('gate-1', { tenant_id: 'tenant-a' }), actor: AGENT });
    const paid = await createReceiptStore({ db: asA }).runOnce({
      taskId: 'gate-1',
      step: 'pay',
      tool: 'payments.charge',
      args: { amount: 7 },
      onUncertain: 'gate',
      effect: async () => ({ charged: 7 }),
    });
    expect(paid.status).toBe('succeeded');
    // A receipt waiting for a human, as the library leaves one (moved here by the owner).
    await sql`INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status,
                                        worker, tenant_id, fencing_token)
              VALUES ('00000000-0000-4000-8000-00000000a001', 'gate-1/ship', 'gate-1', 'ship', 'deployer', 'sha256:aa',
                      'started', 'w1', 'tenant-a', 7)`.execute(t.db);
    await sql`UPDATE tool_receipt SET status = 'uncertain', error = 'the call was cut off'
               WHERE idempotency_key = 'gate-1/ship'`.execute(t.db);
    await sql`UPDATE tool_receipt SET status = 'gated', resolution = 'waiting for a human decision'
               WHERE idempotency_key = 'gate-1/ship'`.execute(t.db);
    const attempt = (q: ReturnType<typeof sql>) =>
      q.execute(asA).then(
        (r) => Number(r.numAffectedRows),
        (e: Error) => e.message,
      );
    const tries = {
      settledFence: await attempt(sql`UPDATE tool_receipt SET fencing_token = 999,
          lease_id = '33333333-3333-4333-8333-333333333333', lease_task_id = 'other', lease_branch = 'x'
         WHERE task_id = 'gate-1' AND step = 'pay'`),
      gatedRecord: await attempt(sql`UPDATE tool_receipt SET error = 'it ran fine', worker = 'w9', attempt = 5
         WHERE idempotency_key = 'gate-1/ship'`),
      gatedResolutionRewritten: await attempt(sql`UPDATE tool_receipt SET resolution = 'approved by the DPO'
         WHERE idempotency_key = 'gate-1/ship'`),
      gatedResolutionAdded:
        await attempt(sql`UPDATE tool_receipt SET resolution = resolution || '; attempt 2 later reported success'
         WHERE idempotency_key = 'gate-1/ship'`),
    };
    expect(tries).toEqual({
      settledFence: expect.stringMatching(/is settled \(succeeded\): what it records never changes/),
      gatedRecord: expect.stringMatching(/is gated: what it records never changes/),
      gatedResolutionRewritten: expect.stringMatching(/is gated: what it records never changes/),
      gatedResolutionAdded: 1,
    });
    // A compensated receipt moved to gated (what a late success does) with its record rewritten.
    await sql`INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status,
                                        worker, tenant_id, fencing_token)
              VALUES ('00000000-0000-4000-8000-00000000a002', 'gate-1/refund', 'gate-1', 'refund', 'payments', 'sha256:bb',
                      'started', 'w1', 'tenant-a', 7)`.execute(t.db);
    for (const status of ['uncertain', 'compensating', 'compensated'])
      await sql`UPDATE tool_receipt SET status = ${status}, resolution = CASE WHEN ${status} = 'compensated'
                  THEN 'compensated by r-9' END WHERE idempotency_key = 'gate-1/refund'`.execute(t.db);
    expect(
      await attempt(sql`UPDATE tool_receipt SET status = 'gated', fencing_token = 999, worker = 'w9',
           resolution = 'operator approved: the effect never ran' WHERE idempotency_key = 'gate-1/refund'`),
    ).toMatch(/is settled \(compensated\): what it records never changes/);
    expect(
      await attempt(sql`UPDATE tool_receipt SET status = 'gated', resolution = resolution || '; conflict: a late success'
           WHERE idempotency_key = 'gate-1/refund'`),
    ).toBe(1);
    // The operator keeps their hand on it.
    await sql`UPDATE tool_receipt SET resolution = 'checked by the DPO' WHERE idempotency_key = 'gate-1/ship'`.execute(
      t.db,
    );
  });
});
