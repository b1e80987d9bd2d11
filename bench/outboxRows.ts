import { sql } from 'kysely';
import { v7 as uuidv7 } from 'uuid';
import type { Db } from '../src/db/database.js';
import type { Executor } from '../src/db/executor.js';
import { laneOf } from '../src/outbox/lanes.js';

export const PAYLOAD = Buffer.alloc(200, 'x');

export function rows(n: number, keys: number, topic: string) {
  return Array.from({ length: n }, (_, i) => {
    const key = `key-${i % keys}`;
    return { id: uuidv7(), key, lane: laneOf(key), topic };
  });
}

/**
 * Outbox rows as the library writes them: no headers of the caller's; the relay builds
 * `cairn-message-id` from message_id (since migration 0008 a row storing a `cairn-*` header
 * is refused by outbox_headers_ok).
 */
export async function insertRows(
  db: Executor,
  batch: ReturnType<typeof rows>,
  walMessages = false,
): Promise<void> {
  if (walMessages) {
    // Written to the WAL only (migration 0019), as createOutbox({ walMessages: true }) writes them.
    await sql`
      INSERT INTO outbox_wal (message_id, topic, key, headers, payload)
      SELECT id, topic, key, '{}'::jsonb, ${PAYLOAD}
        FROM unnest(${batch.map((r) => r.id)}::uuid[], ${batch.map((r) => r.topic)}::text[],
                    ${batch.map((r) => r.key)}::text[]) AS t(id, topic, key)
    `.execute(db);
    return;
  }
  await sql`
    INSERT INTO outbox (lane, message_id, topic, key, headers, payload)
    SELECT lane, id, topic, key, '{}'::jsonb, ${PAYLOAD}
      FROM unnest(${batch.map((r) => r.lane)}::int[], ${batch.map((r) => r.id)}::uuid[],
                  ${batch.map((r) => r.topic)}::text[], ${batch.map((r) => r.key)}::text[]) AS t(lane, id, topic, key)
  `.execute(db);
}

export async function outboxCount(db: Db): Promise<number> {
  const r = await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox`.execute(db);
  return r.rows[0]!.n;
}

export function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN;
}
