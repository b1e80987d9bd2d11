import { sql } from 'kysely';
import type { Db } from '../../src/db/database.js';
import { laneOf } from '../../src/outbox/lanes.js';
import { waitFor } from './topicReader.js';

/** Waits until the lease of (task, branch) has expired by the database clock. */
export async function waitForLeaseExpiry(
  db: Db,
  taskId: string,
  branch: string,
  deadlineMs = 30_000,
): Promise<void> {
  await waitForLeasesExpired(
    db,
    sql`task_id = ${taskId} AND branch = ${branch}`,
    `the lease ${taskId}/${branch}`,
    deadlineMs,
  );
}

/** Waits until every lease (matching `where`) has expired by the database clock. */
export async function waitForLeasesExpired(
  db: Db,
  where = sql`true`,
  what = 'every lease',
  deadlineMs = 30_000,
): Promise<void> {
  await waitFor(
    `${what} to expire`,
    async () => {
      const { rows } = await sql<{ expired: boolean }>`
        SELECT coalesce(bool_and(expires_at <= now()), true) AS expired FROM task_lease WHERE ${where}`.execute(
        db,
      );
      return rows[0]!.expired;
    },
    deadlineMs,
  );
}

/** Waits until the database clock has passed `instant` by `marginMs`. */
export async function waitForDbClockPast(
  db: Db,
  instant: Date,
  marginMs: number,
  deadlineMs = 30_000,
): Promise<void> {
  await waitFor(
    `the database clock to pass ${instant.toISOString()} + ${marginMs} ms`,
    async () => {
      const { rows } = await sql<{ past: boolean }>`
        SELECT now() > ${instant}::timestamptz + make_interval(secs => ${marginMs / 1000}) AS past`.execute(
        db,
      );
      return rows[0]!.past;
    },
    deadlineMs,
  );
}

/** Waits until the relay lane of `key` has expired by the database clock. */
export function waitForLaneExpiry(db: Db, key: string): Promise<void> {
  return waitFor(`the lane of ${key} to expire by the database clock`, async () => {
    const { rows } = await sql<{ expired: boolean }>`
      SELECT expires_at <= now() AS expired FROM relay_lane WHERE lane = ${laneOf(key)}`.execute(db);
    return rows[0]?.expired === true;
  });
}
