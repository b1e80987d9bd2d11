// Concurrent updates outside a transaction go to Postgres as one statement per tenant
// (src/state/sql/casBatch.ts). Each must keep the outcome it would have had alone, whatever
// another transaction, a trigger or the connection does to the batch it is in.
import { setTimeout as sleep } from 'node:timers/promises';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDb } from '../../src/db/database.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { AGENT, newTask } from './fixtures.js';

let tdb: TestDatabase;
let store: TaskStore;
beforeAll(async () => {
  tdb = await createTestDatabase('cas_coalesce', { max: 12 });
  store = createTaskStore({ db: tdb.db });
});
afterAll(async () => {
  await tdb.drop();
});

/** Created through `through`, whose updates of them then need no read first (it remembers them). */
async function created(ids: string[], tenant = 'acme', through = store): Promise<void> {
  for (const id of ids) await through.create({ task: newTask(id, { tenant_id: tenant }), actor: AGENT });
}

/** Updates started in the same turn of the event loop, as concurrent agents would. */
function updateAll(ids: string[], through = store) {
  return ids.map((taskId, i) =>
    through.update({ taskId, expectedVersion: 1, patch: { budget: { tokens_spent: i + 1 } }, actor: AGENT }),
  );
}

/** Settles within `ms`, or says it is still pending. */
async function within<T>(p: Promise<T>, ms: number): Promise<T | 'pending'> {
  return Promise.race([p, sleep(ms).then(() => 'pending' as const)]);
}

/**
 * A transaction of the tenant's own that writes the audit row of `taskId`'s version 2 (what
 * its next CAS will insert) and keeps it uncommitted until rolled back.
 */
async function auditRowHeld(taskId: string): Promise<{ rollBack(): Promise<void> }> {
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  let written!: () => void;
  const isWritten = new Promise<void>((r) => (written = r));
  const open = tdb.db
    .transaction()
    .execute(async (trx) => {
      await sql`INSERT INTO task_audit (task_id, version, prev_version, tenant_id, actor, patch)
                VALUES (${taskId}, 2, 1, 'acme', 'tenant-sql', '[]')`.execute(trx);
      written();
      await released;
      throw new Error('rolled back by the test');
    })
    .catch(() => {});
  await isWritten;
  return {
    async rollBack() {
      release();
      await open;
    },
  };
}

async function versions(ids: string[]): Promise<Record<string, number>> {
  const { rows } = await sql<{ task_id: string; version: number; audited: number }>`
    SELECT s.task_id, s.version::int,
           (SELECT count(*)::int FROM task_audit a WHERE a.task_id = s.task_id) AS audited
      FROM task_state s WHERE s.task_id IN (${sql.join(ids)})`.execute(tdb.db);
  for (const r of rows) expect(r.audited).toBe(r.version); // one audit row per version, always
  return Object.fromEntries(rows.map((r) => [r.task_id, r.version]));
}

describe('concurrent updates coalesced into one statement', () => {
  it('eight tasks updated at once: each swapped with its own audit row, in fewer transactions than updates', async () => {
    const ids = Array.from({ length: 8 }, (_, i) => `many-${i}`);
    await created(ids);
    const results = await Promise.all(updateAll(ids));
    expect(results.map((r) => r.ok)).toEqual(ids.map(() => true));
    expect(await versions(ids)).toEqual(Object.fromEntries(ids.map((id) => [id, 2])));
    // An audit row's `at` is its transaction's start: rows of one statement share it.
    const { rows } = await sql<{ n: number }>`
      SELECT count(DISTINCT at)::int AS n FROM task_audit WHERE task_id LIKE 'many-%' AND version = 2`.execute(
      tdb.db,
    );
    expect(rows[0]!.n).toBeLessThan(8);
  });

  it('the same task twice at the same version: one swaps, the other is stale, as two statements would be', async () => {
    await created(['twice']);
    const [a, b] = await Promise.all(updateAll(['twice', 'twice']));
    expect([a!.ok, b!.ok].sort()).toEqual([false, true]);
    const lost = a!.ok ? b! : a!;
    expect(lost.ok || lost.error.name).toBe('StaleWriteError');
    expect(await versions(['twice'])).toEqual({ twice: 2 });
  });

  it("a row another transaction holds does not stall the batch's other tasks; it waits alone, then swaps", async () => {
    await created(['free-1', 'held', 'free-2']);
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    let locked!: () => void;
    const isLocked = new Promise<void>((r) => (locked = r));
    const holder = tdb.db.transaction().execute(async (trx) => {
      await sql`SELECT 1 FROM task_state WHERE task_id = 'held' FOR UPDATE`.execute(trx);
      locked();
      await released;
    });
    await isLocked;
    const [free1, held, free2] = updateAll(['free-1', 'held', 'free-2']);
    expect((await within(Promise.all([free1!, free2!]), 5_000)) !== 'pending').toBe(true);
    expect(await within(held!, 300)).toBe('pending');
    release();
    await holder;
    expect((await held!).ok).toBe(true);
    expect(await versions(['free-1', 'held', 'free-2'])).toEqual({ 'free-1': 2, held: 2, 'free-2': 2 });
  });

  it('a row Postgres refuses fails alone with its own error; the others of its batch swap', async () => {
    await created(['ok-1', 'refused', 'ok-2']);
    await sql`
      CREATE FUNCTION refuse_one() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.task_id = 'refused' THEN RAISE EXCEPTION 'refused by a trigger of the test'; END IF;
        RETURN NEW;
      END $$`.execute(tdb.db);
    await sql`CREATE TRIGGER refuse_one BEFORE UPDATE ON task_state FOR EACH ROW EXECUTE FUNCTION refuse_one()`.execute(
      tdb.db,
    );
    try {
      const outcomes = await Promise.allSettled(updateAll(['ok-1', 'refused', 'ok-2']));
      expect(outcomes.map((o) => (o.status === 'fulfilled' ? o.value.ok : String(o.reason)))).toEqual([
        true,
        expect.stringContaining('refused by a trigger of the test'),
        true,
      ]);
      expect(await versions(['ok-1', 'refused', 'ok-2'])).toEqual({ 'ok-1': 2, refused: 1, 'ok-2': 2 });
    } finally {
      await sql`DROP TRIGGER refuse_one ON task_state`.execute(tdb.db);
    }
  });

  it('a connection lost mid-statement is an error for every update in it, never a stale answer', async () => {
    // A pool of its own: pg learns that the killed connection is gone only on its next query.
    const own = createDb({ connectionString: tdb.url, max: 4 });
    const ownStore = createTaskStore({ db: own });
    await created(['cut-1', 'cut-slow', 'cut-2'], 'acme', ownStore);
    await sql`
      CREATE FUNCTION slow_one() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.task_id = 'cut-slow' THEN PERFORM pg_sleep(30); END IF;
        RETURN NEW;
      END $$`.execute(tdb.db);
    await sql`CREATE TRIGGER slow_one BEFORE UPDATE ON task_state FOR EACH ROW EXECUTE FUNCTION slow_one()`.execute(
      tdb.db,
    );
    try {
      const running = Promise.allSettled(updateAll(['cut-1', 'cut-slow', 'cut-2'], ownStore));
      let killed = 0;
      for (let i = 0; i < 100 && killed === 0; i++) {
        await sleep(50);
        const { rows } = await sql<{ killed: boolean }>`
          SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity
           WHERE datname = current_database() AND state = 'active' AND query LIKE '%cairn_cas_batch%'
             AND pid <> pg_backend_pid()`.execute(tdb.db);
        killed = rows.filter((r) => r.killed).length;
      }
      expect(killed).toBe(1);
      const outcomes = await running;
      expect(outcomes.map((o) => o.status)).toEqual(['rejected', 'rejected', 'rejected']);
      expect(await versions(['cut-1', 'cut-slow', 'cut-2'])).toEqual({
        'cut-1': 1,
        'cut-slow': 1,
        'cut-2': 1,
      });
    } finally {
      await own.destroy();
      await sql`DROP TRIGGER slow_one ON task_state`.execute(tdb.db);
    }
  });

  it("what a tenant's own SQL makes a statement wait for stalls that tenant's task only: not another tenant's, nor later ones", async () => {
    await created(['acme-stuck']);
    await created(['acme-later']);
    await created(['globex-task'], 'globex');
    const tenantsOwn = await auditRowHeld('acme-stuck');
    const [stuck, other] = updateAll(['acme-stuck', 'globex-task']);
    expect(((await within(other!, 5_000)) as { ok?: boolean }).ok).toBe(true);
    expect(await within(stuck!, 300)).toBe('pending');
    // Past the batch's slot: the same tenant's next update is not behind the stalled statement.
    const [later] = updateAll(['acme-later']);
    expect(((await within(later!, 5_000)) as { ok?: boolean }).ok).toBe(true);
    await tenantsOwn.rollBack();
    expect((await stuck!).ok).toBe(true);
    expect(await versions(['acme-stuck', 'acme-later', 'globex-task'])).toEqual({
      'acme-stuck': 2,
      'acme-later': 2,
      'globex-task': 2,
    });
  });
  it('a task batched with one whose audit insert waits swaps as alone, and its row is not held for long', async () => {
    await created(['mate-stuck', 'mate-innocent']);
    const tenantsOwn = await auditRowHeld('mate-stuck');
    const [stuck, innocent] = updateAll(['mate-stuck', 'mate-innocent']);
    expect(((await within(innocent!, 3_000)) as { ok?: boolean }).ok).toBe(true);
    // Another writer of the innocent task (a store that does not coalesce): not blocked by the batch.
    const other = createTaskStore({ db: tdb.db, coalesceUpdates: false });
    const otherWrite = other.update({
      taskId: 'mate-innocent',
      expectedVersion: 2,
      patch: { budget: { hops_used: 1 } },
      actor: AGENT,
    });
    expect(((await within(otherWrite, 2_000)) as { ok?: boolean }).ok).toBe(true);
    expect(await within(stuck!, 300)).toBe('pending');
    await tenantsOwn.rollBack();
    expect((await stuck!).ok).toBe(true);
    expect(await versions(['mate-stuck', 'mate-innocent'])).toEqual({ 'mate-stuck': 2, 'mate-innocent': 3 });
  });

  it("a tenant's own connection (row-level security) coalesces its updates too", async () => {
    const { app, asA } = await twoTenants(tdb, 4);
    try {
      const a = createTaskStore({ db: asA });
      const ids = ['rls-1', 'rls-2', 'rls-3', 'rls-4'];
      for (const id of ids) await a.create({ task: newTask(id, { tenant_id: 'tenant-a' }), actor: AGENT });
      const results = await Promise.all(updateAll(ids, a));
      expect(results.map((r) => r.ok)).toEqual([true, true, true, true]);
      const { rows } = await sql<{ n: number }>`
        SELECT count(DISTINCT at)::int AS n FROM task_audit WHERE task_id LIKE 'rls-%' AND version = 2`.execute(
        tdb.db,
      );
      expect(rows[0]!.n).toBeLessThan(4);
    } finally {
      await app.destroy();
    }
  });
  it('a statement timeout that cancels the batch (57014, nothing written) fails only the update that waited', async () => {
    // A pool whose statements time out before the batch's lock_timeout (100 ms).
    const own = createDb({ connectionString: tdb.url, max: 4, statementTimeoutMillis: 90 });
    const ownStore = createTaskStore({ db: own });
    try {
      const ids = ['timeout-stuck', 'timeout-1', 'timeout-2', 'timeout-3'];
      await created(ids, 'acme', ownStore);
      const tenantsOwn = await auditRowHeld('timeout-stuck');
      const outcomes = await Promise.allSettled(updateAll(ids, ownStore));
      await tenantsOwn.rollBack();
      expect(
        outcomes.map((o) => (o.status === 'fulfilled' ? o.value.ok : (o.reason as { code?: string }).code)),
      ).toEqual(['57014', true, true, true]);
      expect(await versions(ids)).toEqual({
        'timeout-stuck': 1,
        'timeout-1': 2,
        'timeout-2': 2,
        'timeout-3': 2,
      });
    } finally {
      await own.destroy();
    }
  });
});

describe('a database not migrated to 0014 yet (no cairn_cas_batch)', () => {
  let old: TestDatabase;
  beforeAll(async () => {
    old = await createTestDatabase('cas_coalesce_0013', { max: 8 });
    await sql`DROP FUNCTION cairn_cas_batch(jsonb)`.execute(old.db);
  });
  afterAll(async () => {
    await old.drop();
  });

  it('concurrent updates still swap, each in a statement of its own', async () => {
    const oldStore = createTaskStore({ db: old.db });
    const ids = Array.from({ length: 40 }, (_, i) => `old-${i}`);
    for (const id of ids) await oldStore.create({ task: newTask(id), actor: AGENT });
    const first = await Promise.all(updateAll(ids, oldStore));
    expect(first.every((r) => r.ok)).toBe(true);
    const again = await Promise.all(
      ids.map((taskId) =>
        oldStore.update({ taskId, expectedVersion: 2, patch: { budget: { hops_used: 1 } }, actor: AGENT }),
      ),
    );
    expect(again.every((r) => r.ok)).toBe(true);
  });
});
