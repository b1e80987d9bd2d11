import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';

/**
 * Deletes inbox rows older than the retention window in batches (short transactions, so a
 * running consumer is never blocked for long). Returns how many rows went.
 */
export async function pruneInbox(
  db: Executor,
  opts: { olderThanMs: number; batchSize?: number; maxBatches?: number },
): Promise<number> {
  let total = 0;
  for (let i = 0; i < (opts.maxBatches ?? 1000); i++) {
    const result = await sql`
      DELETE FROM inbox WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM inbox
         WHERE applied_at < now() - make_interval(secs => ${opts.olderThanMs / 1000})
         LIMIT ${opts.batchSize ?? 5000}))
    `.execute(db);
    const n = Number(result.numAffectedRows ?? 0);
    total += n;
    if (n === 0) break;
  }
  return total;
}
