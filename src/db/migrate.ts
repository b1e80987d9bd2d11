import { type MigrationResult, Migrator, sql } from 'kysely';
import { migrationProvider, migrations } from '../../migrations/index.js';
import { CairnError, ConfigurationError } from '../errors.js';
import {
  adoptLegacyMigrations,
  legacyExecutedAt,
  MIGRATION_LOCK_TABLE,
  MIGRATION_TABLE,
} from './adoptLegacyMigrations.js';
import type { Db } from './database.js';
import { schemaOf } from './tenant.js';

function migrator(db: Db): Migrator {
  // kysely's Migrator serializes concurrent runs with a lock row held in a transaction
  // (and tolerates concurrent creation of its own tables), so several processes may call
  // this at once on an empty database. Tables of Cairn's own keep the user's Migrator, with
  // kysely's default kysely_migration, from seeing Cairn's migrations as its own.
  return new Migrator({
    db,
    provider: migrationProvider,
    migrationTableSchema: schemaOf(db),
    migrationTableName: MIGRATION_TABLE,
    migrationLockTableName: MIGRATION_LOCK_TABLE,
  });
}

/** Runs every pending migration; returns the names that ran in this call. */
export async function migrateToLatest(db: Db): Promise<string[]> {
  const schema = schemaOf(db);
  await refuseTablesElsewhere(db, schema);
  // Before the first migration: its tables go to the first schema on the path that exists.
  // IF NOT EXISTS still races with a concurrent CREATE (a unique violation on the catalog).
  await sql`CREATE SCHEMA IF NOT EXISTS ${sql.id(schema)}`.execute(db).catch((error: { code?: string }) => {
    if (error.code !== '23505' && error.code !== '42P06') throw error;
  });
  try {
    await adoptLegacyMigrations(db, Object.keys(migrations));
  } catch (error) {
    throw new CairnError(
      'migration_failed',
      `moving Cairn's migration records from kysely_migration to ${MIGRATION_TABLE} failed: ${(error as Error).message ?? String(error)}`,
      { cause: error },
    );
  }
  const { error, results } = await migrator(db).migrateToLatest();
  if (error) {
    const failed = results?.find((r: MigrationResult) => r.status === 'Error');
    throw new CairnError(
      'migration_failed',
      `migration ${failed?.migrationName ?? '(setup)'} failed: ${(error as Error).message ?? String(error)}`,
      { cause: error },
    );
  }
  return (results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName);
}

/**
 * A database migrated by Cairn 0.2 has Cairn's tables in `public`: migrating it again into
 * another schema would install a second, empty Cairn beside the first. Say so instead.
 */
async function refuseTablesElsewhere(db: Db, schema: string): Promise<void> {
  if (schema === 'public') return;
  const { rows } = await sql<{ legacy: boolean; here: boolean }>`
    SELECT to_regclass('public.task_state') IS NOT NULL
       AND to_regclass('public.task_audit') IS NOT NULL
       AND to_regclass('public.tool_receipt') IS NOT NULL AS legacy,
           to_regclass(${`${schema}.task_state`}) IS NOT NULL AS here`.execute(db);
  if (rows[0]?.legacy && !rows[0].here) {
    throw new ConfigurationError(
      `Cairn's tables are in schema public (a database migrated by Cairn 0.2), not in schema ${schema}: ` +
        "keep them there with createDb({ schema: 'public' }) or CAIRN_SCHEMA=public for every process " +
        `(migrating into ${schema} would install a second, empty Cairn beside them)`,
    );
  }
}

/**
 * Each migration and when it ran. Reads only: a migration that Cairn 0.2 recorded in
 * kysely_migration, not yet moved by migrateToLatest, counts as applied.
 */
export async function migrationStatus(db: Db): Promise<Array<{ name: string; executedAt?: Date }>> {
  const infos = await migrator(db).getMigrations();
  const legacy = await legacyExecutedAt(db, Object.keys(migrations));
  return infos.map((m) => {
    const executedAt = m.executedAt ?? legacy.get(m.name);
    return { name: m.name, ...(executedAt ? { executedAt } : {}) };
  });
}
