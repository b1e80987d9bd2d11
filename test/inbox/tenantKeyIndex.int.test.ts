import { Migrator, sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrationProvider } from '../../migrations/index.js';
import { MIGRATION_LOCK_TABLE, MIGRATION_TABLE } from '../../src/db/adoptLegacyMigrations.js';
import { migrateToLatest } from '../../src/db/migrate.js';
import { schemaOf } from '../../src/db/tenant.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

describe("migration 0013: inbox_tenant_key holds tenants' rows only", () => {
  let t: TestDatabase;
  beforeAll(async () => {
    t = await createTestDatabase('inbox_tenant_key', { migrate: false });
    await sql`CREATE SCHEMA ${sql.id(schemaOf(t.db))}`.execute(t.db);
    const before = new Migrator({
      db: t.db,
      provider: migrationProvider,
      migrationTableSchema: schemaOf(t.db),
      migrationTableName: MIGRATION_TABLE,
      migrationLockTableName: MIGRATION_LOCK_TABLE,
    });
    const { error } = await before.migrateTo('0012_outbox_safe_ids');
    if (error) throw error;
    await sql`
      INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", key, tenant_id)
      SELECT 'g', 'm' || i, 't', 0, i, 'task-' || (i % 10), CASE WHEN i % 2 = 0 THEN 'acme' END
        FROM generate_series(1, 1000) i`.execute(t.db);
    await migrateToLatest(t.db);
  });
  afterAll(async () => {
    await t?.drop();
  });

  it('an upgraded database keeps every inbox row, and the index only those with a tenant', async () => {
    const { rows } = await sql<{ all: number; tenants: number; def: string }>`
      SELECT count(*)::int AS all, count(tenant_id)::int AS tenants,
             pg_get_indexdef('inbox_tenant_key'::regclass) AS def FROM inbox`.execute(t.db);
    expect(rows[0]).toMatchObject({ all: 1000, tenants: 500 });
    expect(rows[0]!.def).toMatch(/\(tenant_id, key\) WHERE \(tenant_id IS NOT NULL\)$/);
  });

  it("retention's erasure of a tenant's task (key and tenant as parameters) still finds its rows through the index", async () => {
    const plan = await t.db.connection().execute(async (c) => {
      await sql`SET enable_seqscan = off`.execute(c);
      await sql`SET plan_cache_mode = force_generic_plan`.execute(c);
      await sql`PREPARE erase(text[], text) AS DELETE FROM inbox WHERE key = ANY($1) AND tenant_id = $2`.execute(
        c,
      );
      const { rows } = await sql<{ 'QUERY PLAN': string }>`EXPLAIN EXECUTE erase('{task-2}', 'acme')`.execute(
        c,
      );
      const n = await sql<{ n: number }>`
        SELECT count(*)::int AS n FROM inbox WHERE key = ANY(${['task-2']}::text[]) AND tenant_id = ${'acme'}`.execute(
        c,
      );
      await sql`DEALLOCATE erase; RESET enable_seqscan; RESET plan_cache_mode`.execute(c);
      return { text: rows.map((r) => r['QUERY PLAN']).join('\n'), n: n.rows[0]!.n };
    });
    expect(plan.text).toContain('inbox_tenant_key');
    expect(plan.n).toBe(100);
  });
});
