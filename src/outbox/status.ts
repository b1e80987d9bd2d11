import { sql } from 'kysely';
import type { Db } from '../db/database.js';

export interface OutboxStatus {
  backlog: number;
  oldest_unpublished_seconds: number | null;
  parked_keys: number;
  lanes: Array<{ owner: string; lanes: number; fencing_tokens: string }>;
  /** Relay instances that sent a heartbeat in the last 30 seconds. */
  relays_alive: number;
  /**
   * Rows the library never writes and that harm others: a lane past 31 (no relay sends it), an
   * id past 2^53 (the relay cannot carry it) or ahead of the id sequence (the insert that draws
   * it later fails). Migration 0012 refuses new ones; rows a tenant's own SQL planted before it
   * stay until an operator removes them (`cairn outbox skip <message_id>`).
   */
  planted_rows: number;
}

/** What an operator wants to see first: how much waits, since when, what is stuck, who relays. */
export async function outboxStatus(db: Db): Promise<OutboxStatus> {
  const [backlog, parked, lanes, relays] = await Promise.all([
    sql<{ n: number; oldest: number | null; planted: number }>`
      SELECT count(*)::int AS n, extract(epoch FROM now() - min(created_at))::float8 AS oldest,
             count(*) FILTER (
               WHERE lane > 31 OR id NOT BETWEEN 1 AND 9007199254740991
                  OR id > coalesce(pg_sequence_last_value(pg_get_serial_sequence('outbox', 'id')::regclass), 0)
             )::int AS planted
        FROM outbox`.execute(db),
    sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox_parked_key`.execute(db),
    sql<{ owner: string; lanes: number; tokens: string }>`
      SELECT owner, count(*)::int AS lanes, min(fencing_token) || '..' || max(fencing_token) AS tokens
        FROM relay_lane WHERE owner IS NOT NULL AND expires_at > now() GROUP BY owner ORDER BY owner`.execute(
      db,
    ),
    sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM relay_instance WHERE last_seen > now() - interval '30 seconds'`.execute(
      db,
    ),
  ]);
  return {
    backlog: backlog.rows[0]!.n,
    oldest_unpublished_seconds:
      backlog.rows[0]!.oldest === null ? null : Number(backlog.rows[0]!.oldest.toFixed(3)),
    parked_keys: parked.rows[0]!.n,
    lanes: lanes.rows.map((l) => ({ owner: l.owner, lanes: l.lanes, fencing_tokens: l.tokens })),
    relays_alive: relays.rows[0]!.n,
    planted_rows: backlog.rows[0]!.planted,
  };
}
