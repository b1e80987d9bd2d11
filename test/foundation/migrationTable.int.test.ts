import { Kysely, type Migration, Migrator, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { afterAll, describe, expect, it, onTestFinished } from 'vitest';
import { migrationProvider, migrations } from '../../migrations/index.js';
import { createDb } from '../../src/db/database.js';
import { migrateToLatest, migrationStatus } from '../../src/db/migrate.js';
import { ConfigurationError } from '../../src/errors.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { newTask } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const cairnNames = Object.keys(migrations).sort();

/** A user's own migrations, run by their own kysely Migrator with its default tables. */
const userMigrations: Record<string, Migration> = {
  '2024_01_01_widget': {
    async up(db: Kysely<unknown>) {
      await sql`CREATE TABLE widget (id int PRIMARY KEY, name text NOT NULL)`.execute(db);
    },
  },
  '2024_02_01_widget_colour': {
    async up(db: Kysely<unknown>) {
      await sql`ALTER TABLE widget ADD COLUMN colour text`.execute(db);
    },
  },
  // A table of the user's that happens to share a name with one of Cairn's.
  '2024_03_01_outbox': {
    async up(db: Kysely<unknown>) {
      await sql`CREATE TABLE outbox (id int PRIMARY KEY, note text NOT NULL)`.execute(db);
    },
  },
};
const userMigrator = (db: Kysely<unknown>) =>
  new Migrator({ db, provider: { getMigrations: async () => userMigrations } });

async function names(
  // biome-ignore lint/suspicious/noExplicitAny: Cairn's typed Db or the user's untyped Kysely
  db: Kysely<any>,
  table: 'kysely_migration' | 'cairn_migration' | 'public.cairn_migration' | 'cairn.cairn_migration',
): Promise<string[]> {
  const r = await sql<{ name: string }>`SELECT name FROM ${sql.table(table)} ORDER BY name`.execute(db);
  return r.rows.map((x) => x.name);
}

describe("Cairn's migrations in cairn_migration, beside the user's kysely_migration", () => {
  const dbs: TestDatabase[] = [];
  afterAll(async () => {
    for (const d of dbs) await d.drop();
  });

  it('a database migrated into kysely_migration by Cairn 0.2 is adopted by five processes at once: nothing re-runs, data and the user rows stay', async () => {
    // A 0.2 database keeps Cairn in public: every process runs with schema 'public'.
    const target = await createTestDatabase('legacy_adopt', { migrate: false, schema: 'public' });
    dbs.push(target);
    // Cairn 0.2: kysely's Migrator with its default tables over the same migrations.
    const old = await new Migrator({ db: target.db, provider: migrationProvider }).migrateToLatest();
    expect(old.error).toBeUndefined();
    const stamps = await sql<{ name: string; timestamp: string }>`
      SELECT name, timestamp FROM kysely_migration ORDER BY name`.execute(target.db);
    await sql`INSERT INTO task_state (task_id, tenant_id, version, schema_version, status, doc)
              VALUES ('t1', 'acme', 1, 'oaies.task-state.v2', 'planning', '{"title":"kept"}')`.execute(
      target.db,
    );
    await sql`INSERT INTO kysely_migration (name, timestamp) VALUES ('2023_user_own', '2023-01-01T00:00:00.000Z')`.execute(
      target.db,
    );

    // --status reads only: before any upgrade it already counts 0.2's rows as applied.
    const before = await migrationStatus(target.db);
    expect(before.map((m) => m.name)).toEqual(cairnNames);
    expect(before.every((m) => m.executedAt instanceof Date)).toBe(true);
    expect(
      (await sql<{ r: string | null }>`SELECT to_regclass('cairn_migration')::text AS r`.execute(target.db))
        .rows[0]!.r,
    ).toBeNull();

    const runners = Array.from({ length: 5 }, () =>
      createDb({ connectionString: target.url, max: 2, schema: 'public' }),
    );
    try {
      const ran = await Promise.all(runners.map((db) => migrateToLatest(db)));
      expect(ran.flat()).toEqual([]); // no migration ran again
    } finally {
      await Promise.all(runners.map((db) => db.destroy()));
    }

    const adopted = await sql<{ name: string; timestamp: string }>`
      SELECT name, timestamp FROM cairn_migration ORDER BY name`.execute(target.db);
    expect(adopted.rows).toEqual(stamps.rows); // same names, same timestamps
    expect(await names(target.db, 'kysely_migration')).toEqual(['2023_user_own']);
    const task = await sql<{
      doc: { title: string };
    }>`SELECT doc FROM task_state WHERE task_id = 't1'`.execute(target.db);
    expect(task.rows[0]!.doc.title).toBe('kept');
    expect((await migrationStatus(target.db)).every((m) => m.executedAt instanceof Date)).toBe(true);
    expect(await migrateToLatest(target.db)).toEqual([]); // and again: nothing
    expect(await names(target.db, 'cairn_migration')).toEqual(cairnNames);
  });

  it('a database that 0.2 migrated part of the way: the recorded ones are adopted, the rest run', async () => {
    const target = await createTestDatabase('legacy_partial', { migrate: false, schema: 'public' });
    dbs.push(target);
    const firstFive = Object.fromEntries(cairnNames.slice(0, 5).map((n) => [n, migrations[n]!]));
    const old = await new Migrator({
      db: target.db,
      provider: { getMigrations: async () => firstFive },
    }).migrateToLatest();
    expect(old.error).toBeUndefined();
    expect(await migrateToLatest(target.db)).toEqual(cairnNames.slice(5));
    expect(await names(target.db, 'cairn_migration')).toEqual(cairnNames);
    expect(await names(target.db, 'kysely_migration')).toEqual([]);
  });

  for (const order of ['cairn first', 'user first'] as const) {
    it(`the user's own kysely Migrator and Cairn's migrateToLatest in one database (${order}): each sees only its own migrations`, async () => {
      const target = await createTestDatabase(`side_by_side_${order.split(' ')[0]}`, { migrate: false });
      dbs.push(target);
      // The user's own Kysely on their own pool: pg's defaults, search_path "$user", public.
      const userPool = new pg.Pool({ connectionString: target.url, max: 2 });
      const user = new Kysely<unknown>({ dialect: new PostgresDialect({ pool: userPool }) });
      onTestFinished(() => user.destroy());
      const runUser = async () => {
        const r = await userMigrator(user).migrateToLatest();
        if (r.error) throw r.error; // "corrupted migrations" would land here
        return (r.results ?? []).map((x) => x.migrationName);
      };
      if (order === 'cairn first') {
        expect(await migrateToLatest(target.db)).toEqual(cairnNames);
        expect(await runUser()).toEqual(Object.keys(userMigrations));
      } else {
        expect(await runUser()).toEqual(Object.keys(userMigrations));
        expect(await migrateToLatest(target.db)).toEqual(cairnNames);
      }
      // Both again, in the other order: nothing to run, no error.
      expect(await runUser()).toEqual([]);
      expect(await migrateToLatest(target.db)).toEqual([]);

      expect(await names(user, 'kysely_migration')).toEqual(Object.keys(userMigrations));
      expect(await names(user, 'cairn.cairn_migration')).toEqual(cairnNames);
      const userView = await userMigrator(user).getMigrations();
      expect(userView.map((m) => [m.name, m.executedAt instanceof Date])).toEqual(
        Object.keys(userMigrations).map((n) => [n, true]),
      );
      const cairnView = await migrationStatus(target.db);
      expect(cairnView.map((m) => [m.name, m.executedAt instanceof Date])).toEqual(
        cairnNames.map((n) => [n, true]),
      );
      await sql`INSERT INTO widget (id, name, colour) VALUES (1, 'w', 'red')`.execute(user);

      // Every table, function and trigger of Cairn's is in schema cairn; public holds the user's.
      const bySchema = await sql<{ schema: string; name: string }>`
        SELECT table_schema AS schema, table_name AS name FROM information_schema.tables
         WHERE table_schema IN ('public', 'cairn') ORDER BY 1, 2`.execute(user);
      expect(bySchema.rows.filter((r) => r.schema === 'public').map((r) => r.name)).toEqual([
        'kysely_migration',
        'kysely_migration_lock',
        'outbox',
        'widget',
      ]);
      expect(bySchema.rows.filter((r) => r.schema === 'cairn').map((r) => r.name)).toEqual(
        expect.arrayContaining(['task_state', 'outbox', 'inbox', 'tool_receipt', 'cairn_migration']),
      );
      const publicFunctions = await sql<{ n: number }>`
        SELECT count(*)::int AS n FROM pg_proc WHERE pronamespace = 'public'::regnamespace`.execute(user);
      expect(publicFunctions.rows[0]!.n).toBe(0);

      // Cairn writes its outbox, the user's outbox of the same name stays the user's.
      const tasks = createTaskStore({ db: target.db });
      const t = await tasks.create({ task: newTask('side-1'), actor: 'spiffe://test/app' });
      const r = await tasks.update({
        taskId: 'side-1',
        expectedVersion: t.version,
        patch: {},
        actor: 'spiffe://test/app',
        messages: [{ topic: 'side.topic', payload: { hello: 1 } }],
      });
      expect(r.ok).toBe(true);
      await sql`INSERT INTO outbox (id, note) VALUES (1, 'mine')`.execute(user);
      const counts = await sql<{ cairn: number; mine: number }>`
        SELECT (SELECT count(*)::int FROM cairn.outbox) AS cairn,
               (SELECT count(*)::int FROM public.outbox) AS mine`.execute(user);
      expect(counts.rows[0]).toEqual({ cairn: 1, mine: 1 });
    });
  }

  it('a second install in another schema of the same database is refused by name (migrate and --status), nothing created', async () => {
    const target = await createTestDatabase('second_install');
    dbs.push(target);
    const other = createDb({ connectionString: target.url, max: 1, schema: 'other' });
    onTestFinished(() => other.destroy());
    for (const call of [() => migrateToLatest(other), () => migrationStatus(other)]) {
      const error = await call().catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ConfigurationError);
      expect((error as Error).message).toMatch(
        /in schema cairn, not in schema other: .*CAIRN_SCHEMA=cairn.*One Cairn per database/,
      );
    }
    const made = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_namespace WHERE nspname = 'other'`.execute(target.db);
    expect(made.rows[0]!.n).toBe(0);
  });

  it("a connection string with options of its own (statement_timeout): Cairn's search_path is added, not dropped, and the migrations land in cairn", async () => {
    const target = await createTestDatabase('url_options', { migrate: false });
    dbs.push(target);
    const u = new URL(target.url);
    u.searchParams.set('options', '-c statement_timeout=60000');
    const db = createDb({ connectionString: u.toString(), max: 1 });
    onTestFinished(() => db.destroy());
    expect(await migrateToLatest(db)).toEqual(cairnNames);
    const r = await sql<{ t: string | null; p: string | null; timeout: string }>`
      SELECT to_regclass('cairn.task_state')::text AS t, to_regclass('public.task_state')::text AS p,
             current_setting('statement_timeout') AS timeout`.execute(db);
    expect(r.rows[0]).toEqual({ t: 'task_state', p: null, timeout: '1min' });
  });

  it('a 0.2 database (Cairn in public) migrated with the default schema: a clear error, nothing created', async () => {
    const target = await createTestDatabase('legacy_default', { migrate: false, schema: 'public' });
    dbs.push(target);
    await migrateToLatest(target.db);
    const fresh = createDb({ connectionString: target.url, max: 1 });
    onTestFinished(() => fresh.destroy());
    const error = await migrateToLatest(fresh).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConfigurationError);
    expect((error as Error).message).toMatch(/in schema public .*not in schema cairn.*schema: 'public'/);
    const cairn = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_namespace WHERE nspname = 'cairn'`.execute(target.db);
    expect(cairn.rows[0]!.n).toBe(0);
  });
});
