/**
 * Retention run by an operator twice at once (a cron and a hand run), or one run paused
 * (GC, SIGSTOP) between choosing its batch and its delete transaction. The batch is chosen
 * outside the transaction; under the lock only "unpublished" is looked at again.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDb, type Db } from '../../src/db/database.js';
import { registerTenant } from '../../src/db/tenant.js';
import { runRetention, setRetentionPolicy } from '../../src/retention/retention.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { pausePoint } from '../support/pausePoint.js';
import { slowPool } from '../support/slowPool.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const OPERATOR = 'spiffe://acme.example/operators/dpo';
const TENANT = 'ret-slow';
let t: TestDatabase;
let store: TaskStore;

beforeAll(async () => {
  t = await createTestDatabase('retention_slow');
  await registerTenant(t.db, TENANT);
  store = createTaskStore({ db: t.db });
  await setRetentionPolicy(t.db, { tenantId: TENANT, dataClass: 'internal', retainDays: 0 });
});
afterAll(async () => {
  await t?.drop();
});

async function finished(taskId: string) {
  await store.create({ task: newTask(taskId, { tenant_id: TENANT }), actor: AGENT });
  const r = await store.update({ taskId, expectedVersion: 1, patch: { status: 'cancelled' }, actor: AGENT });
  if (!r.ok) throw r.error;
}

/** A second operator's database whose run holds after its batch was chosen (the expired() query answered). */
function pausedRun() {
  const pause = pausePoint();
  let armed = true;
  const pool = slowPool(t.url, (text) => {
    if (armed && text.includes('WITH t AS') && text.includes('retention_policy')) {
      armed = false;
      return pause.hold();
    }
    return undefined;
  });
  const db: Db = createDb({ pool, endPoolOnDestroy: true });
  return { db, pause };
}

const certificatesFor = async (taskId: string) =>
  (
    await sql<{
      run_id: string;
      body: { tasks: Array<{ task_id: string; audit_rows: number }>; totals: { tasks: number } };
    }>`
      SELECT run_id, body FROM deletion_certificate`.execute(t.db)
  ).rows.filter((c) => c.body.tasks.some((x) => x.task_id === taskId));

describe('retention: a run paused after choosing its batch', () => {
  it('two runs at once: the task is certified deleted once, not a second time by the run that deleted nothing', async () => {
    await finished('dup-1');
    const slow = pausedRun();
    const late = runRetention({ db: slow.db, actor: OPERATOR, tenantId: TENANT });
    await slow.pause.reached; // the slow run chose dup-1
    const first = await runRetention({ db: t.db, actor: OPERATOR, tenantId: TENANT });
    expect(first.tasks).toEqual(['dup-1']);
    slow.pause.release();
    const second = await late;
    await slow.db.destroy();
    const certs = await certificatesFor('dup-1');
    // Observed: the second run issues a certificate for dup-1 with audit_rows 0 and totals.tasks 0.
    expect(second.tasks, 'the run that deleted nothing reports dup-1 as deleted').toEqual([]);
    expect(certs.map((c) => c.body.tasks.find((x) => x.task_id === 'dup-1')!.audit_rows)).toEqual([2]);
  });

  it('a task deleted by another run and created again under its id (live) meanwhile is not deleted by the late run', async () => {
    await finished('reused-1');
    const slow = pausedRun();
    const late = runRetention({ db: slow.db, actor: OPERATOR, tenantId: TENANT });
    await slow.pause.reached; // the slow run chose reused-1 (cancelled, expired)
    expect((await runRetention({ db: t.db, actor: OPERATOR, tenantId: TENANT })).tasks).toEqual(['reused-1']);
    // The tenant starts a new task under the same id (ids from business keys), and works on it.
    await store.create({ task: newTask('reused-1', { tenant_id: TENANT }), actor: AGENT });
    const w = await store.update({
      taskId: 'reused-1',
      expectedVersion: 1,
      patch: { status: 'implementing', gates: { plan_approved: true } },
      actor: AGENT,
    });
    expect(w.ok).toBe(true);
    slow.pause.release();
    await late;
    await slow.db.destroy();
    const now = await store.get('reused-1');
    // Observed: the live task, its audit log and all, is deleted under a certificate for a cancelled task.
    expect(now?.status, 'the live task survives a late retention run').toBe('implementing');
    const audit = await t.db
      .selectFrom('task_audit')
      .select('version')
      .where('task_id', '=', 'reused-1')
      .execute();
    expect(audit).toHaveLength(2);
  });
});
