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
  planted_rows: number | null;
}

/**
 * The planted rows (see {@link OutboxStatus.planted_rows}), through index ranges only. The
 * sequence's position is read first, on its own: `pg_sequence_last_value` is volatile, and in
 * a row filter it ran once per row and turned off the parallel scan (15 s for a backlog of 1M
 * rows, which a metrics scrape waits for); as a value of its own the planner sees it and
 * probes the primary key. A sequence that does not say where it is (never used, or reset with
 * is_called false) only leaves out the "ahead of the sequence" check.
 */
export async function plantedRows(db: Db) {
  const { rows } = await sql<{ bound: string }>`
    SELECT least(coalesce(pg_sequence_last_value(pg_get_serial_sequence('outbox', 'id')::regclass),
                          9007199254740991), 9007199254740991)::text AS bound`.execute(db);
  const bound = rows[0]!.bound;
  return sql<{ message_id: string; tenant_id: string | null }>`
    SELECT message_id, tenant_id FROM outbox WHERE lane > 31
    UNION
    SELECT message_id, tenant_id FROM outbox WHERE id < 1
    UNION
    SELECT message_id, tenant_id FROM outbox WHERE id > ${bound}::bigint`;
}

/** Up to `limit` planted rows, for an operator to skip. */
export async function listPlantedRows(
  db: Db,
  limit: number,
): Promise<Array<{ message_id: string; tenant_id: string | null }>> {
  const { rows } = await sql<{ message_id: string; tenant_id: string | null }>`
    SELECT message_id, tenant_id FROM (${await plantedRows(db)}) p ORDER BY message_id LIMIT ${limit}`.execute(
    db,
  );
  return rows;
}

/** What an operator wants to see first: how much waits, since when, what is stuck, who relays. */
export async function outboxStatus(db: Db): Promise<OutboxStatus> {
  const [backlog, parked, lanes, relays, planted] = await Promise.all([
    sql<{ n: number; oldest: number | null }>`
      SELECT count(*)::int AS n, extract(epoch FROM now() - min(created_at))::float8 AS oldest FROM outbox`.execute(
      db,
    ),
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
    // A role that may read the outbox but not its sequence still gets the rest (null here).
    plantedRows(db)
      .then((rows) => sql<{ n: number }>`SELECT count(*)::int AS n FROM (${rows}) p`.execute(db))
      .then(
        (r) => r.rows[0]!.n,
        () => null,
      ),
  ]);
  return {
    backlog: backlog.rows[0]!.n,
    oldest_unpublished_seconds:
      backlog.rows[0]!.oldest === null ? null : Number(backlog.rows[0]!.oldest.toFixed(3)),
    parked_keys: parked.rows[0]!.n,
    lanes: lanes.rows.map((l) => ({ owner: l.owner, lanes: l.lanes, fencing_tokens: l.tokens })),
    relays_alive: relays.rows[0]!.n,
    planted_rows: planted,
  };
}
