import { parseArgs } from 'node:util';
import { migrateToLatest, migrationStatus } from '../src/db/migrate.js';
import { schemaOf } from '../src/db/tenant.js';
import { COMMAND_LOCKS, sayingWhoHolds } from './lockWait.js';
import { line, printResult } from './output.js';
import { withDb } from './withDb.js';

export async function migrateCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: { status: { type: 'boolean', default: false }, json: { type: 'boolean' } },
  });
  return withDb(async (db) => {
    if (values.status) {
      const migrations = await migrationStatus(db);
      printResult(values.json, migrations, () => {
        for (const m of migrations) {
          console.log(
            line`${m.executedAt ? 'applied ' : 'pending '} ${m.name}${m.executedAt ? `  (${m.executedAt.toISOString()})` : ''}`,
          );
        }
      });
      return 0;
    }
    const ran = await sayingWhoHolds(db, { migration: COMMAND_LOCKS.migration }, () => migrateToLatest(db), {
      json: values.json === true,
    });
    const schema = schemaOf(db);
    printResult(values.json, { schema, ran }, () => {
      if (ran.length === 0) console.log(line`schema ${schema} is up to date; no migration ran`);
      for (const name of ran) console.log(line`ran ${name} (schema ${schema})`);
    });
    return 0;
  });
}
