import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { createDb, type Db } from '../../src/db/database.js';
import { forTenant } from '../../src/db/tenant.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
let app: Db; // logs in as cairn_app: not the owner, so row-level security applies
let asA: Db;
let asB: Db;

const TABLES = ['task_state', 'task_audit', 'checkpoint', 'checkpoint_snapshot', 'outbox'] as const;

beforeAll(async () => {
  t = await createTestDatabase('tenancy');
  ({ app, asA, asB } = await twoTenants(t, 4));
  // Each tenant writes its own tasks through the library, as the application role.
  for (const [db, tenant] of [
    [asA, 'tenant-a'],
    [asB, 'tenant-b'],
  ] as const) {
    const store = createTaskStore({ db, checkpointer: createCheckpointer({ db }) });
    for (const n of [1, 2]) {
      const id = `${tenant}-task-${n}`;
      await store.create({ task: newTask(id, { tenant_id: tenant }), actor: AGENT });
      const r = await store.update({
        taskId: id,
        expectedVersion: 1,
        patch: { status: 'implementing', gates: { plan_approved: true } },
        actor: AGENT,
        messages: [{ topic: 'tenancy.events', payload: { n } }],
      });
      expect(r.ok).toBe(true);
    }
  }
});

afterAll(async () => {
  await app?.destroy();
  await t?.drop();
});

describe('tenant isolation (row-level security, as the application role)', () => {
  it('a tenant reads only its own rows, even with a query that omits the tenant filter', async () => {
    for (const table of TABLES) {
      const rows = await sql<{ tenant_id: string }>`SELECT tenant_id FROM ${sql.table(table)}`.execute(asA);
      expect(rows.rows.length, table).toBeGreaterThan(0);
      expect(new Set(rows.rows.map((r) => r.tenant_id)), table).toEqual(new Set(['tenant-a']));
    }
    // Tenant-keyed rows inherited the task's tenant (leases, receipts, checkpoints take it in a trigger).
    const owner = await sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM checkpoint WHERE tenant_id IS NULL`.execute(t.db);
    expect(owner.rows[0]!.n).toBe(0);
  });

  it("a tenant cannot update or delete another tenant's rows by a hand-written query", async () => {
    const upd = await sql`UPDATE task_state SET updated_at = now() WHERE task_id = 'tenant-b-task-1'`.execute(
      asA,
    );
    expect(Number(upd.numAffectedRows)).toBe(0);
    // Outbox rows are deleted by the relay and operators only (migration 0015), a tenant's own too.
    await expect(sql`DELETE FROM outbox`.execute(asA)).rejects.toThrow(/permission denied/);
    const delState = await sql`DELETE FROM task_state WHERE tenant_id = 'tenant-b'`.execute(asA);
    expect(Number(delState.numAffectedRows)).toBe(0);
    const b = await sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM outbox WHERE tenant_id = 'tenant-b'`.execute(t.db);
    expect(b.rows[0]!.n).toBe(2);
    const bState = await t.db
      .selectFrom('task_state')
      .select('version')
      .where('task_id', '=', 'tenant-b-task-1')
      .executeTakeFirstOrThrow();
    expect(bState.version).toBe(2);
  });

  it("a tenant cannot write a row as another tenant, and the store does not see another tenant's task", async () => {
    await expect(
      sql`INSERT INTO task_annotation (annotation_id, tenant_id, task_id, author, body)
          VALUES (gen_random_uuid(), 'tenant-b', 'tenant-b-task-1', 'x', 'y')`.execute(asA),
    ).rejects.toThrow(/row-level security|belongs to another tenant/);
    const storeA = createTaskStore({ db: asA, cacheSize: 0 });
    expect(await storeA.get('tenant-b-task-1')).toBeUndefined();
    // To tenant A, tenant B's task does not exist.
    await expect(
      storeA.update({
        taskId: 'tenant-b-task-1',
        expectedVersion: 2,
        patch: { status: 'reviewing' },
        actor: AGENT,
      }),
    ).rejects.toThrow(/task tenant-b-task-1 does not exist/);
    await expect(
      storeA.create({ task: newTask('sneaky', { tenant_id: 'tenant-b' }), actor: AGENT }),
    ).rejects.toThrow(/row-level security|tenant/);
    expect(
      await t.db.selectFrom('task_state').select('task_id').where('task_id', '=', 'sneaky').execute(),
    ).toEqual([]);
  });

  it('the application role with no tenant set sees nothing; a bad tenant id is refused by name', async () => {
    const rows = await sql`SELECT * FROM task_state`.execute(app);
    expect(rows.rows).toEqual([]);
    expect(() => forTenant(app, 'Tenant B; DROP')).toThrow(/tenant_id.*"Tenant B; DROP"/);
  });

  it('no leak: the application pool used for tenant A then B, and unscoped in between, sees A, nothing, B', async () => {
    const single = createDb({
      connectionString: (() => {
        const u = new URL(t.url);
        u.username = 'cairn_app';
        return u.toString();
      })(),
      max: 1,
    });
    try {
      const a = await sql<{ tenant_id: string }>`SELECT DISTINCT tenant_id FROM task_state`.execute(
        forTenant(single, 'tenant-a'),
      );
      const none = await sql`SELECT * FROM task_state`.execute(single);
      const b = await sql<{ tenant_id: string }>`SELECT DISTINCT tenant_id FROM task_state`.execute(
        forTenant(single, 'tenant-b'),
      );
      expect(a.rows).toEqual([{ tenant_id: 'tenant-a' }]);
      expect(none.rows).toEqual([]);
      expect(b.rows).toEqual([{ tenant_id: 'tenant-b' }]);
    } finally {
      await single.destroy();
    }
  });
});
