import { sql } from 'kysely';
import type { Db } from '../../src/db/database.js';
import { messageOf } from '../../src/errors.js';
import type { Logger } from '../../src/logger.js';

/**
 * Deletes inbox rows older than the retention window in batches (short transactions, so a
 * running consumer is never blocked for long), oldest first: a prune cut short (maxBatches, a
 * process stopped) leaves the newest of the old rows, never a random subset of them, so the
 * oldest kept row still says how far back the inbox is complete (the failover check's horizon,
 * src/recovery/failoverMirror.ts). Returns how many rows went.
 */
export async function pruneInbox(
  db: Db,
  opts: {
    olderThanMs: number;
    /** Only this consumer group's rows (a consumer prunes its own; the CLI, without it, every group's). */
    groupId?: string;
    batchSize?: number;
    maxBatches?: number;
  },
): Promise<number> {
  const ofGroup = opts.groupId === undefined ? sql`` : sql`AND consumer_group = ${opts.groupId}`;
  let total = 0;
  for (let i = 0; i < (opts.maxBatches ?? 1000); i++) {
    // Deleting an applied row is retention's alone (the inbox guard refuses it otherwise).
    const result = await db.transaction().execute(async (trx) => {
      await sql`SELECT set_config('cairn.retention', 'on', true)`.execute(trx);
      return sql`
        DELETE FROM inbox WHERE ctid = ANY(ARRAY(
          SELECT ctid FROM inbox
           WHERE applied_at < now() - make_interval(secs => ${opts.olderThanMs / 1000}) ${ofGroup}
           ORDER BY applied_at
           LIMIT ${opts.batchSize ?? 5000}))
      `.execute(trx);
    });
    const n = Number(result.numAffectedRows ?? 0);
    total += n;
    if (n === 0) break;
  }
  return total;
}

/**
 * A consumer's own pruning: its group's rows older than `olderThanMs`, every `everyMs` (the
 * timer does not keep the process alive); stop() ends it.
 */
export function schedulePruning(
  db: Db,
  o: { groupId: string; olderThanMs: number; everyMs: number; log: Logger },
): { stop(): void } {
  let timer: NodeJS.Timeout | undefined;
  const next = () => {
    timer = setTimeout(async () => {
      try {
        // Its own group's rows only: another group's dedupe window is its consumers' retention.
        const removed = await pruneInbox(db, { olderThanMs: o.olderThanMs, groupId: o.groupId });
        if (removed > 0) o.log.info({ removed }, 'pruned inbox rows');
      } catch (err) {
        o.log.warn({ err: messageOf(err) }, 'inbox prune failed');
      }
      next();
    }, o.everyMs);
    timer.unref();
  };
  next();
  return { stop: () => clearTimeout(timer) };
}
