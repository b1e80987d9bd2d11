/**
 * Invariant 8: a fencing token only grows. Retention deletes a task's task_lease rows with
 * the task; a task created again under the same id starts its lease at token 1 again, and a
 * worker of the earlier task, paused with token 1 (its lease not even expired), passes the
 * fence of the new holder: holdsFence compares the token, not the lease id.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { registerTenant } from '../../src/db/tenant.js';
import { LeaseLostError } from '../../src/errors.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { runRetention, setRetentionPolicy } from '../../src/retention/retention.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const TENANT = 'lease-ret';
const OP = 'spiffe://acme.example/operators/dpo';
let t: TestDatabase;

beforeAll(async () => {
  t = await createTestDatabase('lease_retention');
  await registerTenant(t.db, TENANT);
  await setRetentionPolicy(t.db, { tenantId: TENANT, dataClass: 'internal', retainDays: 0 });
});
afterAll(async () => {
  await t?.drop();
});

describe('fencing tokens across a task deleted by retention and created again', () => {
  it("a paused worker of the earlier task cannot write under the new holder's lease", async () => {
    const store = createTaskStore({ db: t.db });
    const leases = createLeaseManager({ db: t.db });
    await store.create({ task: newTask('T', { tenant_id: TENANT }), actor: AGENT });
    const w1 = await leases.acquire({ taskId: 'T', branch: 'main', agentId: 'w1', ttlMs: 600_000 });
    if (!w1.ok) throw new Error('w1 lease');
    // W1 pauses (GC, SIGSTOP). An operator cancels the task; retention (0 days) deletes it.
    const c = await store.update({
      taskId: 'T',
      expectedVersion: 1,
      patch: { status: 'cancelled' },
      actor: OP,
    });
    expect(c.ok).toBe(true);
    expect((await runRetention({ db: t.db, actor: OP, tenantId: TENANT })).tasks).toEqual(['T']);
    // The tenant starts a task under the same id; W2 takes its lease.
    await store.create({ task: newTask('T', { tenant_id: TENANT }), actor: AGENT });
    const w2 = await leases.acquire({ taskId: 'T', branch: 'main', agentId: 'w2', ttlMs: 600_000 });
    if (!w2.ok) throw new Error('w2 lease');
    expect.soft(w2.fencingToken, 'a fencing token only grows').toBeGreaterThan(w1.fencingToken);
    // W1 wakes and writes with its fence: refused, whatever the tokens.
    await expect(
      store.update({
        taskId: 'T',
        expectedVersion: 1,
        patch: { status: 'cancelled' },
        actor: AGENT,
        lease: w1,
      }),
      "W1's write under W2's lease",
    ).rejects.toThrow(LeaseLostError);
    expect((await store.get('T'))?.status).toBe('planning');
  });
});
