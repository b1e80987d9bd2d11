import { sql } from 'kysely';
import type { Db } from './database.js';
import { schemaOf } from './tenant.js';

/** Where Cairn's migrations are recorded: tables of its own, so a user's kysely Migrator keeps its defaults. */
export const MIGRATION_TABLE = 'cairn_migration';
export const MIGRATION_LOCK_TABLE = 'cairn_migration_lock';
/** Where Cairn 0.2 and earlier recorded them: kysely's default table, shared with the user's own Migrator. */
export const LEGACY_MIGRATION_TABLE = 'kysely_migration';

// The advisory lock every kysely Migrator takes on Postgres, whatever its table names
// (PostgresAdapter's LOCK_ID in kysely 0.28). Adopting under the same key means no kysely
// migrator (the user's, or an older Cairn process) reads kysely_migration half-adopted.
const KYSELY_MIGRATION_LOCK_ID = BigInt('3853314791062309107');

/**
 * Moves Cairn's rows (only the names in `names`) from kysely_migration to cairn_migration, so
 * a database migrated by Cairn 0.2 neither re-runs a migration nor makes the user's own
 * Migrator fail with "corrupted migrations: previously executed migration 0001_task_state is
 * missing". The user's rows and the table itself stay. Returns the names moved by this call.
 *
 * Safe to run from several processes at once and to repeat: rows are only ever moved out of
 * kysely_migration, so a process that sees none there (checked without the lock) has nothing
 * to do, and the rest re-read under the lock, where only the first one finds rows to move.
 */
export async function adoptLegacyMigrations(db: Db, names: readonly string[]): Promise<string[]> {
  if (names.length === 0 || (await legacyRows(db, names)) === 0) return [];
  const table = sql.table(`${schemaOf(db)}.${MIGRATION_TABLE}`);
  return db.transaction().execute(async (trx) => {
    await sql`SELECT pg_advisory_xact_lock(${sql.lit(KYSELY_MIGRATION_LOCK_ID)})`.execute(trx);
    if ((await legacyRows(trx, names)) === 0) return [];
    // The shape kysely's Migrator creates (and expects): the timestamp is an ISO string.
    await sql`
      CREATE TABLE IF NOT EXISTS ${table} (
        name varchar(255) NOT NULL PRIMARY KEY,
        timestamp varchar(255) NOT NULL
      )`.execute(trx);
    const moved = await sql<{ name: string }>`
      WITH moved AS (
        DELETE FROM ${sql.table(LEGACY_MIGRATION_TABLE)} WHERE name = ANY(${[...names]}::text[])
        RETURNING name, timestamp
      )
      INSERT INTO ${table} (name, timestamp)
      SELECT name, timestamp FROM moved
      ON CONFLICT (name) DO NOTHING
      RETURNING name`.execute(trx);
    return moved.rows.map((r) => r.name).sort();
  });
}

/** How many of Cairn's rows kysely_migration still holds (0 when the table does not exist). */
export async function legacyRows(db: Db, names: readonly string[]): Promise<number> {
  const table = await sql<{ present: boolean }>`
    SELECT to_regclass(${LEGACY_MIGRATION_TABLE}) IS NOT NULL AS present`.execute(db);
  if (!table.rows[0]?.present) return 0;
  const rows = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM ${sql.table(LEGACY_MIGRATION_TABLE)}
    WHERE name = ANY(${[...names]}::text[])`.execute(db);
  return rows.rows[0]?.n ?? 0;
}

/** When each of Cairn's migrations was recorded in kysely_migration (not adopted yet). */
export async function legacyExecutedAt(db: Db, names: readonly string[]): Promise<Map<string, Date>> {
  if ((await legacyRows(db, names)) === 0) return new Map();
  const rows = await sql<{ name: string; timestamp: string }>`
    SELECT name, timestamp FROM ${sql.table(LEGACY_MIGRATION_TABLE)}
    WHERE name = ANY(${[...names]}::text[])`.execute(db);
  return new Map(rows.rows.map((r) => [r.name, new Date(r.timestamp)]));
}
