import { sql } from 'kysely';
import type { Db } from '../src/db/database.js';
import type { Logger } from '../src/logger.js';

/**
 * `VACUUM (SKIP_LOCKED) outbox` every `every` deletes (0: never), one at a time, in the
 * background on a pool connection: VACUUM cannot run inside a transaction, and it only takes a
 * lock that lets inserts, claims and deletes go on. Autovacuum naps for a minute, while a queue
 * table churns faster than that (README, Benchmarks).
 */
export function createVacuumer(o: { db: Db; log: Logger; every: number }): (deleted: number) => void {
  let deletedSinceVacuum = 0;
  let vacuuming = false;
  return (deleted) => {
    deletedSinceVacuum += deleted;
    if (o.every <= 0 || vacuuming || deletedSinceVacuum < o.every) return;
    deletedSinceVacuum = 0;
    vacuuming = true;
    void sql`VACUUM (SKIP_LOCKED) outbox`
      .execute(o.db)
      .catch((err: Error) =>
        o.log.warn({ err: err.message }, 'VACUUM outbox failed; leaving it to autovacuum'),
      )
      .finally(() => {
        vacuuming = false;
      });
  };
}
