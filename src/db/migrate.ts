import { type MigrationResult, Migrator } from 'kysely';
import { migrationProvider, migrations } from '../../migrations/index.js';
import { CairnError } from '../errors.js';
import {
  adoptLegacyMigrations,
  legacyExecutedAt,
  MIGRATION_LOCK_TABLE,
  MIGRATION_TABLE,
} from './adoptLegacyMigrations.js';
import type { Db } from './database.js';

function migrator(db: Db): Migrator {
  // kysely's Migrator serializes concurrent runs with a lock row held in a transaction
  // (and tolerates concurrent creation of its own tables), so several processes may call
  // this at once on an empty database. Tables of Cairn's own keep the user's Migrator, with
  // kysely's default kysely_migration, from seeing Cairn's migrations as its own.
  return new Migrator({
    db,
    provider: migrationProvider,
    migrationTableName: MIGRATION_TABLE,
    migrationLockTableName: MIGRATION_LOCK_TABLE,
  });
}

/** Runs every pending migration; returns the names that ran in this call. */
export async function migrateToLatest(db: Db): Promise<string[]> {
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
