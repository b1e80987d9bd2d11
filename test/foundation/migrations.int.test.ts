import { sql } from 'kysely';
import { afterAll, describe, expect, it } from 'vitest';
import { migrations } from '../../migrations/index.js';
import { createDb } from '../../src/db/database.js';
import { migrateToLatest, migrationStatus } from '../../src/db/migrate.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

describe('migrations on real Postgres', () => {
  const dbs: TestDatabase[] = [];
  afterAll(async () => {
    for (const d of dbs) await d.drop();
  });

  it('five migrators started at once on an empty database end with one correct schema and no error', async () => {
    const target = await createTestDatabase('migrate5', { migrate: false });
    dbs.push(target);
    const runners = Array.from({ length: 5 }, () => createDb({ connectionString: target.url, max: 2 }));
    try {
      const ran = await Promise.all(runners.map((db) => migrateToLatest(db)));
      // Every migration ran exactly once across the five runners.
      expect(ran.flat().sort()).toEqual(Object.keys(migrations).sort());
    } finally {
      await Promise.all(runners.map((db) => db.destroy()));
    }

    const tables = await sql<{ table_name: string }>`
      SELECT table_name FROM information_schema.tables WHERE table_schema = 'cairn' ORDER BY table_name
    `.execute(target.db);
    const names = tables.rows.map((r) => r.table_name);
    for (const t of ['task_state', 'task_audit', 'task_status', 'task_transition', 'cairn_migration']) {
      expect(names).toContain(t);
    }
    // kysely's default tables stay free for the user's own Migrator.
    expect(names).not.toContain('kysely_migration');
    const status = await migrationStatus(target.db);
    expect(status.every((m) => m.executedAt instanceof Date)).toBe(true);
    expect(await migrateToLatest(target.db)).toEqual([]);
  });

  it('the schema itself refuses a change to a terminal task, even from hand-written SQL', async () => {
    const target = await createTestDatabase('migrate_guard');
    dbs.push(target);
    await sql`INSERT INTO task_state (task_id, tenant_id, version, schema_version, status, doc)
              VALUES ('t1', 'acme', 1, 'oaies.task-state.v2', 'complete', '{}')`.execute(target.db);
    await expect(
      sql`UPDATE task_state SET version = 2, status = 'planning' WHERE task_id = 't1'`.execute(target.db),
    ).rejects.toThrow(/task t1 is complete \(terminal\) and can never change again/);
    await expect(sql`DELETE FROM task_audit`.execute(target.db)).resolves.toBeDefined(); // no rows: no trigger fires
  });
});
