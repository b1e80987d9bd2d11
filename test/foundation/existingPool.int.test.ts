import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDb } from '../../src/db/database.js';
import { ConfigurationError, ValidationError } from '../../src/errors.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const actor = 'spiffe://acme.example/agents/planner';
const newTask = (id: string) => ({
  tenant_id: 'acme',
  task_id: id,
  workflow_digest: `sha256:${'0'.repeat(64)}`,
  intent_id: `I-${id}`,
});

describe('createDb({ pool }): Cairn on the application pg.Pool', () => {
  let tdb: TestDatabase;
  let pool: pg.Pool;
  beforeAll(async () => {
    tdb = await createTestDatabase('existing_pool');
    pool = new pg.Pool({ connectionString: tdb.url, max: 2 });
  });
  afterAll(async () => {
    await pool.end().catch(() => {});
    await tdb?.drop();
  });

  it('reads versions as numbers without touching the pool parsers or pg globals; destroy() leaves the pool open', async () => {
    const db = createDb({ pool });
    const tasks = createTaskStore({ db });
    const created = await tasks.create({ task: newTask('P-1'), actor });
    const r = await tasks.update({ taskId: 'P-1', expectedVersion: created.version, patch: {}, actor });
    expect(r.ok).toBe(true);
    const row = await db
      .selectFrom('task_state')
      .select('version')
      .where('task_id', '=', 'P-1')
      .executeTakeFirstOrThrow();
    expect(row.version).toBe(2); // a number, compared with ===
    // The application's own queries on the same pool keep pg's default: int8 as a string.
    const own = await pool.query<{ version: unknown }>(
      "SELECT version FROM cairn.task_state WHERE task_id = 'P-1'",
    );
    expect(own.rows[0]?.version).toBe('2');
    // Cairn's schema led the search_path only while Cairn held a client: the pool's own is back.
    const clients = await Promise.all([pool.connect(), pool.connect()]);
    for (const c of clients) {
      expect((await c.query<{ search_path: string }>('SHOW search_path')).rows[0]?.search_path).toBe(
        '"$user", public',
      );
      c.release();
    }
    expect(pg.types.getTypeParser(20)('7')).toBe('7');
    await db.destroy();
    expect((await pool.query('SELECT 1 AS one')).rows[0]).toEqual({ one: 1 });
  });

  it('endPoolOnDestroy: true hands the pool to destroy()', async () => {
    const own = new pg.Pool({ connectionString: tdb.url, max: 1 });
    const db = createDb({ pool: own, endPoolOnDestroy: true });
    await sql`SELECT 1`.execute(db);
    await db.destroy();
    expect(own.ended).toBe(true);
  });

  it("a pool whose path starts with Cairn's schema, changed by the application between two checkouts: Cairn still finds its tables", async () => {
    const own = new pg.Pool({ connectionString: tdb.url, max: 1, options: '-c search_path=cairn,public' });
    const db = createDb({ pool: own, endPoolOnDestroy: true });
    const tasks = createTaskStore({ db });
    await tasks.create({ task: newTask('P-2'), actor });
    // A schema-per-request application points the path elsewhere and releases the client.
    const c = await own.connect();
    await c.query('SET search_path = public');
    c.release();
    expect((await tasks.get('P-2'))?.version).toBe(1);
    // The application's own path is back once Cairn releases the client.
    const again = await own.connect();
    expect((await again.query<{ search_path: string }>('SHOW search_path')).rows[0]?.search_path).toBe(
      'public',
    );
    again.release();
    await db.destroy();
  });

  it('neither, both, or pool settings beside a pool: a ValidationError naming the field', () => {
    expect(() => createDb({} as never)).toThrow(ValidationError);
    expect(() => createDb({} as never)).toThrow(/connectionString: give either connectionString .* or pool/);
    expect(() => createDb({ connectionString: tdb.url, pool } as never)).toThrow(
      /pool: give either connectionString or pool, not both/,
    );
    expect(() => createDb({ pool, max: 3 } as never)).toThrow(/max: set it on your pg.Pool/);
    expect(() => createDb({ pool: {} } as never)).toThrow(/pool: must be a pg.Pool/);
  });
});

describe('an unmigrated database', () => {
  let tdb: TestDatabase;
  beforeAll(async () => {
    tdb = await createTestDatabase('unmigrated_store', { migrate: false, max: 2 });
  });
  afterAll(async () => {
    await tdb?.drop();
  });

  it('the task store says to run cairn migrate, not "relation does not exist"', async () => {
    const tasks = createTaskStore({ db: tdb.db });
    for (const call of [
      () => tasks.create({ task: newTask('U-1'), actor }),
      () => tasks.get('U-1'),
      () => tasks.update({ taskId: 'U-1', expectedVersion: 1, patch: {}, actor }),
      () => tasks.history('U-1'),
    ]) {
      const err = await call().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(ConfigurationError);
      expect((err as Error).message).toMatch(
        /no Cairn table "task_(state|audit)".*run `cairn migrate` first \(or `await migrateToLatest\(db\)`/,
      );
    }
  });

  it("an application table that is missing stays Postgres's error", async () => {
    const err = await sql`SELECT * FROM my_orders`.execute(tdb.db).then(
      () => undefined,
      (e: unknown) => e,
    );
    const { mapSqlError } = await import('../../src/db/sqlstate.js');
    expect(mapSqlError(err)).toBe(err);
  });
});
