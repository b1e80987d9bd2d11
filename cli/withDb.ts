import { assertReachable, createDb, type Db } from '../src/db/database.js';
import { databaseUrlFromEnv } from '../src/env.js';

/** Opens DATABASE_URL, fails fast with a clear message if it does not answer, and always closes it. */
export async function withDb<T>(fn: (db: Db) => Promise<T>, max = 2): Promise<T> {
  const url = databaseUrlFromEnv();
  const db = createDb({ connectionString: url, max });
  try {
    await assertReachable(db, url);
    return await fn(db);
  } finally {
    await db.destroy();
  }
}
