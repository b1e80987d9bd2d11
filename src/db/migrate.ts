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
  await refuseInstallElsewhere(db, schema);
  // Before the first migration: its tables go to the first schema on the path that exists.
  // IF NOT EXISTS still races with a concurrent CREATE (a unique violation on the catalog).
  await sql`CREATE SCHEMA IF NOT EXISTS ${sql.id(schema)}`.execute(db).catch((error: { code?: string }) => {
    if (error.code !== '23505' && error.code !== '42P06') throw error;
  });
  await assertConnectionSearchesSchema(db, schema);
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
 * One Cairn per database: its tenant login roles (named by database and tenant) and
 * `cairn_app` are shared by every schema of the database, so a second install would let a
 * tenant of one read the other's rows. Cairn's tables found in another schema (`public`
 * after Cairn 0.2, or a mistyped CAIRN_SCHEMA) are refused by name, before anything is made.
 */
async function refuseInstallElsewhere(db: Db, schema: string): Promise<void> {
  const { rows } = await sql<{ schema: string }>`
    SELECT n.nspname AS schema FROM pg_namespace n
     WHERE n.nspname <> ${schema}
       AND EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'task_state' AND c.relkind IN ('r', 'p'))
       AND EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'task_audit' AND c.relkind IN ('r', 'p'))
       AND EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'tool_receipt' AND c.relkind IN ('r', 'p'))
     ORDER BY 1`.execute(db);
  const elsewhere = rows[0]?.schema;
  if (elsewhere === undefined) return;
  throw new ConfigurationError(
    `Cairn's tables are in schema ${elsewhere}${elsewhere === 'public' ? ' (a database migrated by Cairn 0.2)' : ''}, ` +
      `not in schema ${schema}: keep them there with createDb({ schema: '${elsewhere}' }) or CAIRN_SCHEMA=${elsewhere} ` +
      `for every process. One Cairn per database: a second install in ${schema} would share its tenant roles ` +
      'with the first and start empty',
  );
}

/**
 * The migrations create their objects in the first schema of the connection's search_path:
 * refuse to run when that is not Cairn's (an `options` of the connection string or a role's
 * own search_path could put another first).
 */
async function assertConnectionSearchesSchema(db: Db, schema: string): Promise<void> {
  const ask = () =>
    sql<{ current: string | null; path: string }>`
    SELECT current_schema() AS current, current_setting('search_path') AS path`.execute(db);
  let { rows } = await ask();
  // Several migrators at once: the one whose CREATE SCHEMA lost the race may ask on a pooled
  // connection that does not see the winner's schema yet (seen once in five). Ask again briefly
  // before calling the search_path wrong.
  for (let i = 0; i < 20 && rows[0]?.current !== schema; i++) {
    await new Promise((r) => setTimeout(r, 50));
    ({ rows } = await ask());
  }
  if (rows[0]?.current !== schema) {
    throw new ConfigurationError(
      `the connection's search_path is "${rows[0]?.path}", so migrations would create Cairn's tables in ` +
        `${rows[0]?.current ?? 'no schema'}, not in ${schema}: remove search_path from the connection's options ` +
        '(DATABASE_URL) and from the role (ALTER ROLE ... RESET search_path)',
    );
  }
}

/**
 * Each migration and when it ran. Reads only: a migration that Cairn 0.2 recorded in
 * kysely_migration, not yet moved by migrateToLatest, counts as applied. Cairn's tables in
 * another schema than the database's are refused as by migrateToLatest.
 */
export async function migrationStatus(db: Db): Promise<Array<{ name: string; executedAt?: Date }>> {
  await refuseInstallElsewhere(db, schemaOf(db));
  const infos = await migrator(db).getMigrations();
  const legacy = await legacyExecutedAt(db, Object.keys(migrations));
  return infos.map((m) => {
    const executedAt = m.executedAt ?? legacy.get(m.name);
    return { name: m.name, ...(executedAt ? { executedAt } : {}) };
  });
}
