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
 * One retention run (`cairn retention run`, no tenant named) goes through every tenant with a
 * policy, one after the other. What one tenant writes with its own SQL into its own rows must
 * not keep another tenant's expired data from being deleted.
 */
let t: TestDatabase;
let app: Db;
const as: Record<string, Db> = {};
let attacker: string;
let victim: string;
const OPERATOR = 'spiffe://acme.example/operators/dpo';

async function cancelledTask(tenant: string, taskId: string) {
  const store = createTaskStore({ db: as[tenant]!, checkpointer: createCheckpointer({ db: as[tenant]! }) });
  await store.create({ task: newTask(taskId, { tenant_id: tenant }), actor: AGENT });
  const r = await store.update({ taskId, expectedVersion: 1, patch: { status: 'cancelled' }, actor: AGENT });
  if (!r.ok) throw r.error;
}

const exists = async (taskId: string) =>
  (await t.db.selectFrom('task_state').select('task_id').where('task_id', '=', taskId).execute()).length ===
  1;

function within<T>(ms: number, p: Promise<T>): Promise<T> {
  return Promise.race([
    p,
    new Promise<T>((_, reject) =>
      setTimeout(() => reject(new Error(`retention run still going after ${ms} ms`)), ms),
    ),
  ]);
}

beforeAll(async () => {
  t = await createTestDatabase('adv3_retention');
  let asA: Db;
  let asB: Db;
  ({ app, asA, asB } = await twoTenants(t, 3));
  as['tenant-a'] = asA;
  as['tenant-b'] = asB;
  for (const tenant of ['tenant-a', 'tenant-b']) {
    await setRetentionPolicy(t.db, { tenantId: tenant, dataClass: 'internal', retainDays: 0 });
  }
  // The order runRetention goes through tenants: the attacker is the one it visits first.
  const order = (await t.db.selectFrom('retention_policy').select('tenant_id').distinct().execute()).map(
    (r) => r.tenant_id,
  );
  attacker = order[0]!;
  victim = order[1]!;
});

afterAll(async () => {
  await app?.destroy();
  await t?.drop();
});

describe("one tenant's own rows and one retention run for every tenant", () => {
  it("an audit row of its own task dated 'infinity' does not stop another tenant's deletion", async () => {
    await cancelledTask(attacker, 'atk-1');
    await cancelledTask(victim, 'vic-1');
    // The attacker's own SQL: one more audit row for its own (finished) task.
    await sql`INSERT INTO task_audit (task_id, version, prev_version, tenant_id, actor, patch, at)
              VALUES ('atk-1', 3, 2, ${attacker}, 'x', '[]', 'infinity')`.execute(as[attacker]!);
    let error: unknown;
    await within(30_000, runRetention({ db: t.db, actor: OPERATOR })).catch((e: unknown) => {
      error = e;
    });
    expect(await exists('vic-1')).toBe(false);
    expect(error).toBeUndefined();
    // Its own task goes too: the 'infinity' row is digested as Postgres prints it.
    expect(await exists('atk-1')).toBe(false);
  });

  it("a lock on its own expired task does not hold up another tenant's deletion", async () => {
    await cancelledTask(attacker, 'atk-2');
    await cancelledTask(victim, 'vic-2');
    // Take the poisoned row of the first test out of the way (owner, as retention would).
    await t.db.transaction().execute(async (trx) => {
      await sql`SET LOCAL cairn.retention = 'on'`.execute(trx);
      await sql`DELETE FROM task_audit WHERE task_id = 'atk-1'`.execute(trx);
      await sql`DELETE FROM task_state WHERE task_id = 'atk-1'`.execute(trx);
    });
    let end!: () => void;
    const ended = new Promise<void>((r) => {
      end = r;
    });
    let locked!: () => void;
    const isLocked = new Promise<void>((r) => {
      locked = r;
    });
    const holder = as[attacker]!.connection().execute(async (c) => {
      await sql`BEGIN`.execute(c);
      if (!process.env.ADV3_CONTROL)
        await sql`SELECT 1 FROM task_state WHERE task_id = 'atk-2' FOR UPDATE`.execute(c);
      locked();
      await ended;
      await sql`ROLLBACK`.execute(c);
    });
    await isLocked;
    const run = runRetention({ db: t.db, actor: OPERATOR });
    run.catch(() => {});
    try {
      await within(15_000, run).catch(() => {});
      expect(await exists('vic-2')).toBe(false);
    } finally {
      end();
      await holder;
      await run.catch(() => {});
    }
  });

  it("a tenant reads its own retention policy, not another's", async () => {
    const seen = await sql<{ tenant_id: string }>`SELECT tenant_id FROM retention_policy`.execute(
      as[attacker]!,
    );
    expect(seen.rows.map((r) => r.tenant_id)).toEqual([attacker]);
  });

  it("a lock a tenant takes under the name of another's holds stalls neither its retention nor a hold", async () => {
    await cancelledTask(victim, 'vic-3');
    let end!: () => void;
    const ended = new Promise<void>((r) => {
      end = r;
    });
    let locked!: () => void;
    const isLocked = new Promise<void>((r) => {
      locked = r;
    });
    // Knowing only the victim's tenant id, the attacker's own session holds every lock name a
    // hold on the victim could take (advisory locks are open to every role).
    const holder = as[attacker]!.connection().execute(async (c) => {
      for (const k of [`cairn.hold:${victim}:`, `cairn.hold:${victim}:vic-3`])
        await sql`SELECT pg_advisory_lock(hashtext(${k}))`.execute(c);
      locked();
      await ended;
      await sql`SELECT pg_advisory_unlock_all()`.execute(c);
    });
    await isLocked;
    try {
      const run = await within(15_000, runRetention({ db: t.db, actor: OPERATOR }));
      expect(run.deferred).not.toContain('vic-3');
      expect(await exists('vic-3')).toBe(false);
      const hold = await within(
        5_000,
        placeHold(t.db, { tenantId: victim, reason: 'audit 2026-12', actor: OPERATOR }),
      );
      expect(hold.created).toBe(true);
    } finally {
      end();
      await holder;
    }
  });
});
