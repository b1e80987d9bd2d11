import { parseArgs } from 'node:util';
import { assertReachable, createDb } from '../db/database.js';
import { migrateToLatest, migrationStatus } from '../db/migrate.js';
import { databaseUrlFromEnv } from '../env.js';

export async function migrateCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({ args: argv, options: { status: { type: 'boolean', default: false } } });
  const url = databaseUrlFromEnv();
  const db = createDb({ connectionString: url, max: 2 });
  try {
    await assertReachable(db, url);
    if (values.status) {
      for (const m of await migrationStatus(db)) {
        console.log(
          `${m.executedAt ? 'applied ' : 'pending '} ${m.name}${m.executedAt ? `  (${m.executedAt.toISOString()})` : ''}`,
        );
      }
      return 0;
    }
    const ran = await migrateToLatest(db);
    if (ran.length === 0) console.log('schema is up to date; no migration ran');
    for (const name of ran) console.log(`ran ${name}`);
    return 0;
  } finally {
    await db.destroy();
  }
}
