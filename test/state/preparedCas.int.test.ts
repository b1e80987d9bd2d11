import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDb, type Db } from '../../src/db/database.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const actor = 'spiffe://acme.example/agents/planner';
const newTask = (id: string) => ({
  tenant_id: 'acme',
  task_id: id,
  workflow_digest: `sha256:${'0'.repeat(64)}`,
  intent_id: `I-${id}`,
});

/** Updates a task `times` times through a store on `db` (one connection), then lists that connection's prepared statements. */
async function casThenPrepared(db: Db, taskId: string, times: number): Promise<string[]> {
  const tasks = createTaskStore({ db });
  let version = (await tasks.create({ task: newTask(taskId), actor })).version;
  for (let i = 0; i < times; i++) {
    const r = await tasks.update({
      taskId,
      expectedVersion: version,
      patch: { budget: { tokens_spent: i + 1 } },
      actor,
    });
    if (!r.ok) throw r.error;
    version = r.state.version;
  }
  const stale = await tasks.update({ taskId, expectedVersion: version - 1, patch: {}, actor });
  expect(stale.ok).toBe(false); // a prepared CAS still refuses a stale version
  const rows = await tasks.history(taskId);
  expect(rows.map((r) => r.version)).toEqual(Array.from({ length: times + 1 }, (_, i) => i + 1));
  const { rows: prepared } = await sql<{ name: string }>`SELECT name FROM pg_prepared_statements`.execute(db);
  return prepared.map((p) => p.name);
}

describe('the task CAS as a named prepared statement', () => {
  let tdb: TestDatabase;
  beforeAll(async () => {
    tdb = await createTestDatabase('prepared_cas');
  });
  afterAll(async () => {
    await tdb?.drop();
  });

  it('is prepared once per connection by default: every version audited, a stale version refused', async () => {
    const db = createDb({ connectionString: tdb.url, max: 1 });
    try {
      const names = await casThenPrepared(db, 'PREP-1', 8);
      expect(names.filter((n) => n.startsWith('cairn_'))).toHaveLength(1);
    } finally {
      await db.destroy();
    }
  });

  it('with preparedStatements: false (a PgBouncer in transaction mode) nothing is prepared, on a Cairn pool or the application one', async () => {
    const own = createDb({ connectionString: tdb.url, max: 1, preparedStatements: false });
    const pool = new pg.Pool({ connectionString: tdb.url, max: 1 });
    const onPool = createDb({ pool, preparedStatements: false });
    try {
      expect(await casThenPrepared(own, 'PREP-2', 3)).toEqual([]);
      expect(await casThenPrepared(onPool, 'PREP-3', 3)).toEqual([]);
    } finally {
      await own.destroy();
      await onPool.destroy();
      await pool.end();
    }
  });

  it("runs prepared on the application's pg.Pool only when asked to (its connections are the application's)", async () => {
    const pool = new pg.Pool({ connectionString: tdb.url, max: 1 });
    const unasked = createDb({ pool });
    expect(await casThenPrepared(unasked, 'PREP-5', 2)).toEqual([]);
    await unasked.destroy();
    const db = createDb({ pool, preparedStatements: true });
    try {
      expect((await casThenPrepared(db, 'PREP-4', 3)).filter((n) => n.startsWith('cairn_'))).toHaveLength(1);
    } finally {
      await db.destroy();
      await pool.end();
    }
  });
  it('heals after DEALLOCATE ALL on its connection (say a handler ran it): the next CAS parses it again, on a Cairn pool and the application one', async () => {
    const pool = new pg.Pool({ connectionString: tdb.url, max: 1 });
    const dbs = [
      createDb({ connectionString: tdb.url, max: 1 }),
      createDb({ pool, preparedStatements: true }),
    ];
    try {
      for (const [i, db] of dbs.entries()) {
        const taskId = `PREP-GONE-${i}`;
        const tasks = createTaskStore({ db });
        let version = (await tasks.create({ task: newTask(taskId), actor })).version;
        const bump = async (trx?: Parameters<typeof tasks.update>[0]['trx']) => {
          const r = await tasks.update({
            taskId,
            expectedVersion: version,
            patch: {},
            actor,
            ...(trx ? { trx } : {}),
          });
          if (!r.ok) throw r.error;
          version = r.state.version;
        };
        await bump(); // prepared on the one connection
        await sql`DEALLOCATE ALL`.execute(db);
        await bump(); // outside a transaction: run again, parsed again, nothing lost
        await sql`DEALLOCATE ALL`.execute(db);
        // Inside a transaction the statement's failure aborts it: the caller sees it once...
        await expect(db.transaction().execute((trx) => bump(trx))).rejects.toThrow();
        // ...and the connection is not left failing for good.
        for (let n = 0; n < 3; n++) await db.transaction().execute((trx) => bump(trx));
        await bump();
        expect((await tasks.history(taskId)).map((r) => r.version)).toEqual([1, 2, 3, 4, 5, 6, 7]);
      }
    } finally {
      for (const db of dbs) await db.destroy();
      await pool.end();
    }
  });

  it('a 26000 raised from inside the statement (a trigger) leaves it prepared: later CASes on the connection go on', async () => {
    const db = createDb({ connectionString: tdb.url, max: 1 });
    try {
      await sql`
        CREATE SEQUENCE raise_once;
        CREATE FUNCTION raise_26000_once() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.task_id = 'PREP-TRIGGER' AND nextval('raise_once') = 2 THEN
            RAISE EXCEPTION 'not the statement''s own error' USING ERRCODE = '26000';
          END IF;
          RETURN NEW;
        END $$;
        CREATE TRIGGER raise_26000_once BEFORE INSERT ON task_audit FOR EACH ROW EXECUTE FUNCTION raise_26000_once();
      `.execute(db);
      const tasks = createTaskStore({ db });
      let version = (await tasks.create({ task: newTask('PREP-TRIGGER'), actor })).version; // nextval 1
      for (let n = 0; n < 4; n++) {
        const r = await tasks.update({ taskId: 'PREP-TRIGGER', expectedVersion: version, patch: {}, actor });
        if (!r.ok) throw r.error;
        version = r.state.version;
      }
      expect(version).toBe(5);
    } finally {
      await sql`DROP TRIGGER IF EXISTS raise_26000_once ON task_audit`.execute(db);
      await db.destroy();
    }
  });
});
