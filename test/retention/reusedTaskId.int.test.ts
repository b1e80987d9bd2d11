import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import type { Db } from '../../src/db/database.js';
import { placeHold } from '../../src/retention/holds.js';
import { runRetention, setRetentionPolicy } from '../../src/retention/retention.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

/**
 * Review (a tenant's own SQL): tenant A leaves rows under a task id (a receipt, a checkpoint)
 * and deletes its task; tenant B later creates a task under the same id. Retention deleted by
 * task id alone: B's run deleted A's receipt and certified it as B's, took A's checkpoint's
 * data class for B's task, and with A under a legal hold (the database refusing the delete)
 * chose the same batch again for ever: the run, shared by every tenant, never ended.
 */
let t: TestDatabase;
let app: Db;
let asA: Db;
let asB: Db;

beforeAll(async () => {
  t = await createTestDatabase('retention_reused_id');
  ({ app, asA, asB } = await twoTenants(t, 3));
  await setRetentionPolicy(t.db, { tenantId: 'tenant-b', dataClass: 'internal', retainDays: 0 });
  await setRetentionPolicy(t.db, { tenantId: 'tenant-b', dataClass: 'public', retainDays: 0 });
  await setRetentionPolicy(t.db, { tenantId: 'tenant-b', dataClass: 'confidential', retainDays: 3650 });
});
afterAll(async () => {
  await app?.destroy();
  await t?.drop();
});

/** Tenant A's own SQL: a task row, a receipt and a confidential checkpoint on it, then the task deleted. */
async function leaveRows(id: string): Promise<void> {
  await sql`INSERT INTO task_state (task_id, tenant_id, version, schema_version, status, doc)
            VALUES (${id}, 'tenant-a', 1, 'x', 'planning', ${JSON.stringify({ task_id: id })}::jsonb)`.execute(
    asA,
  );
  await sql`INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status, worker)
            VALUES (gen_random_uuid(), ${`k-${id}`}, ${id}, 's', 't', 'd', 'started', 'w')`.execute(asA);
  await sql`DELETE FROM task_state WHERE task_id = ${id}`.execute(asA);
}
/** Tenant B's task under the same id, through the library, ended (cancelled). */
async function endedTaskOfB(id: string): Promise<void> {
  const store = createTaskStore({ db: asB, checkpointer: createCheckpointer({ db: asB }) });
  await store.create({ task: newTask(id, { tenant_id: 'tenant-b' }), actor: AGENT });
  const r = await store.update({
    taskId: id,
    expectedVersion: 1,
    patch: { status: 'cancelled' },
    actor: AGENT,
  });
  if (!r.ok) throw r.error;
}
const receiptsOfA = async () =>
  (
    await sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM tool_receipt WHERE tenant_id = 'tenant-a'`.execute(t.db)
  ).rows[0]!.n;

describe('retention and a task id another tenant used before', () => {
  it("B's run deletes and certifies B's rows only: A's receipt stays", async () => {
    await leaveRows('order-1');
    await endedTaskOfB('order-1');
    const run = await runRetention({ db: t.db, actor: 'op', tenantId: 'tenant-b' });
    expect(run.tasks).toEqual(['order-1']);
    expect(run.certificates[0]!.body.tasks.map((x) => [x.task_id, x.receipts])).toEqual([['order-1', 0]]);
    expect(await receiptsOfA()).toBe(1);
  });

  it("with tenant A under a legal hold, the run ends and deletes B's task", async () => {
    await leaveRows('order-2');
    await endedTaskOfB('order-2');
    await placeHold(t.db, { tenantId: 'tenant-a', reason: 'litigation', actor: 'op' });
    // Before, the run chose the refused batch for ever: this test's own deadline ended it.
    const run = await runRetention({ db: t.db, actor: 'op', tenantId: 'tenant-b' });
    expect(run.tasks).toEqual(['order-2']);
    expect(await receiptsOfA()).toBe(2);
  }, 30_000);
});
