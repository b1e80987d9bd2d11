import { type MigrationResult, Migrator } from 'kysely';
import { migrationProvider } from '../../migrations/index.js';
import { CairnError } from '../errors.js';
import type { Db } from './database.js';

function migrator(db: Db): Migrator {
  // kysely's Migrator serializes concurrent runs with a lock row held in a transaction
  // (and tolerates concurrent creation of its own tables), so several processes may call
  // this at once on an empty database.
  return new Migrator({ db, provider: migrationProvider });
}

/** Runs every pending migration; returns the names that ran in this call. */
export async function migrateToLatest(db: Db): Promise<string[]> {
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

export async function migrationStatus(db: Db): Promise<Array<{ name: string; executedAt?: Date }>> {
  const infos = await migrator(db).getMigrations();
  return infos.map((m) => ({ name: m.name, ...(m.executedAt ? { executedAt: m.executedAt } : {}) }));
}
