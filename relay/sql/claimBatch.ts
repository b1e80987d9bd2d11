import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';

export interface ClaimedRow {
  id: number;
  lane: number;
  message_id: string;
  topic: string;
  key: string;
  headers: Record<string, string>;
  payload: Buffer;
}

/**
 * The next messages of the lanes this relay owns, oldest first, skipping parked keys.
 *
 * No FOR UPDATE SKIP LOCKED here on purpose: a lane has exactly one owner (relay_lane, with
 * a fencing token), so there is nobody to skip, and skipping a locked row of a key would let
 * that key's next message overtake it. Rows are deleted after the broker acked them, never
 * tracked by a cursor, so a row whose transaction commits after a higher id is simply
 * picked up by the next claim: nothing is skipped. Uses the (lane, id) index.
 */
export async function claimBatch(
  db: Executor,
  lanes: readonly number[],
  limit: number,
  /** Rows published but not yet deleted (their delete is in flight). */
  excludeIds: readonly number[] = [],
): Promise<ClaimedRow[]> {
  if (lanes.length === 0) return [];
  const { rows } = await sql<ClaimedRow>`
    SELECT o.id, o.lane, o.message_id, o.topic, o.key, o.headers, o.payload
      FROM outbox o
     WHERE o.lane = ANY(${lanes}::int[])
       AND o.id <> ALL(${excludeIds}::bigint[])
       AND NOT EXISTS (SELECT 1 FROM outbox_parked_key p WHERE p.topic = o.topic AND p.key = o.key)
     ORDER BY o.id
     LIMIT ${limit}
  `.execute(db);
  return rows;
}

/** Which of these rows' keys are parked right now ("topic\u0000key"). */
export async function parkedAmong(db: Executor, rows: readonly ClaimedRow[]): Promise<Set<string>> {
  if (rows.length === 0) return new Set();
  const { rows: parked } = await sql<{ topic: string; key: string }>`
    SELECT topic, key FROM outbox_parked_key
     WHERE (topic, key) IN (SELECT * FROM unnest(${rows.map((r) => r.topic)}::text[], ${rows.map((r) => r.key)}::text[]))
  `.execute(db);
  return new Set(parked.map((p) => `${p.topic}\u0000${p.key}`));
}
