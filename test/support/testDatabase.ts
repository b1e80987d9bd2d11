import { randomBytes } from 'node:crypto';
import { Migrator, sql } from 'kysely';
import { inject } from 'vitest';
import { migrationProvider } from '../../migrations/index.js';
import { createScratchDatabase } from '../../scripts/lib/scratchDatabase.js';
import { MIGRATION_LOCK_TABLE, MIGRATION_TABLE } from '../../src/db/adoptLegacyMigrations.js';
import { createDb, type Db } from '../../src/db/database.js';
import { migrateToLatest } from '../../src/db/migrate.js';
import { schemaOf } from '../../src/db/tenant.js';
import { createTopicsAndWait } from '../../src/kafka/kafkajsAdmin.js';
import { kafkaClient } from '../../src/kafka/publisher.js';

export interface TestDatabase {
  url: string;
  name: string;
  db: Db;
  /** Drops the database (terminating its sessions). */
  drop(): Promise<void>;
}

/**
 * A database of its own for one test file, so files run in parallel without sharing rows.
 * `migrate: false` gives an empty database (for migration tests); `migrateTo` one migrated up to
 * that migration (an upgrade test then runs the rest).
 */
export async function createTestDatabase(
  label: string,
  opts: { migrate?: boolean; migrateTo?: string; max?: number; schema?: string } = {},
): Promise<TestDatabase> {
  const name = `cairn_t_${label
    .replace(/[^a-z0-9]/gi, '_')
    .toLowerCase()
    .slice(0, 30)}_${randomBytes(4).toString('hex')}`;
  const scratch = await createScratchDatabase(inject('databaseUrl'), name);
  const url = scratch.url;
  const db = createDb({
    connectionString: url,
    max: opts.max ?? 10,
    ...(opts.schema ? { schema: opts.schema } : {}),
  });
  if (opts.migrateTo !== undefined) {
    await sql`CREATE SCHEMA ${sql.id(schemaOf(db))}`.execute(db);
    const { error } = await new Migrator({
      db,
      provider: migrationProvider,
      migrationTableSchema: schemaOf(db),
      migrationTableName: MIGRATION_TABLE,
      migrationLockTableName: MIGRATION_LOCK_TABLE,
    }).migrateTo(opts.migrateTo);
    if (error) throw error;
  } else if (opts.migrate !== false) await migrateToLatest(db);
  return {
    url,
    name,
    db,
    async drop() {
      await db.destroy();
      await scratch.drop();
    },
  };
}

/** A topic name no other test file uses. */
export function uniqueTopic(label: string): string {
  return `cairn-test.${label.replace(/[^a-zA-Z0-9._-]/g, '-')}.${randomBytes(4).toString('hex')}`;
}

export function kafkaBrokers(): string[] {
  return inject('kafkaBrokers').split(',');
}

/** Creates a topic of its own for a test (unique name) and waits for its leaders. */
export async function createTestTopic(
  label: string,
  partitions: number,
  config: Record<string, string> = {},
): Promise<string> {
  const topic = uniqueTopic(label);
  const admin = kafkaClient(kafkaBrokers(), 'cairn-test-admin').admin();
  await admin.connect();
  try {
    const configEntries = Object.entries(config).map(([name, value]) => ({ name, value }));
    await createTopicsAndWait(admin, [{ topic, numPartitions: partitions, configEntries }]);
  } finally {
    await admin.disconnect();
  }
  return topic;
}
