import { sql } from 'kysely';
import type { Db } from '../../src/db/database.js';
import type { Executor } from '../../src/db/executor.js';
import type { Logger } from '../../src/logger.js';
import { LANE_COUNT } from '../../src/outbox/lanes.js';

export async function seedLanes(db: Executor): Promise<void> {
  await sql`INSERT INTO relay_lane (lane) SELECT g FROM generate_series(0, ${LANE_COUNT - 1}::int) g
            ON CONFLICT (lane) DO NOTHING`.execute(db);
}

/** Records that this instance is alive and returns how many instances are (database clock). */
export async function heartbeat(db: Executor, instanceId: string, ttlMs: number): Promise<number> {
  await touchInstance(db, instanceId);
  const { rows } = await sql<{ live: number }>`
    SELECT count(*)::int AS live FROM relay_instance
     WHERE last_seen > now() - make_interval(secs => ${ttlMs / 1000})
  `.execute(db);
  return Math.max(1, rows[0]!.live);
}

/**
 * Gives every lane this instance owns back and forgets the instance (the others then count it
 * out of their share), only if another relay was seen within the lease TTL; returns the lanes
 * given, or undefined when no other relay is live (nothing changed). One transaction under an
 * advisory lock: two relays that both see the other live cannot both step aside.
 */
export async function stepAsideIfOthersLive(
  db: Db,
  instanceId: string,
  ttlMs: number,
): Promise<number[] | undefined> {
  return db.transaction().execute(async (trx) => {
    await sql`SELECT pg_advisory_xact_lock(hashtext('cairn.relay.step_aside'))`.execute(trx);
    const { rows } = await sql<{ live: number }>`
      SELECT count(*)::int AS live FROM relay_instance
       WHERE instance_id <> ${instanceId} AND last_seen > now() - make_interval(secs => ${ttlMs / 1000})
    `.execute(trx);
    if (rows[0]!.live === 0) return undefined;
    const { rows: given } = await sql<{ lane: number }>`
      UPDATE relay_lane SET owner = NULL, expires_at = '-infinity' WHERE owner = ${instanceId} RETURNING lane`.execute(
      trx,
    );
    await sql`DELETE FROM relay_instance WHERE instance_id = ${instanceId}`.execute(trx);
    return given.map((g) => g.lane).sort((a, b) => a - b);
  });
}

/** Extends the leases this instance still holds; returns them with their fencing tokens. */
export async function renewLanes(
  db: Executor,
  instanceId: string,
  ttlMs: number,
): Promise<Map<number, number>> {
  const { rows } = await sql<{ lane: number; fencing_token: number }>`
    UPDATE relay_lane SET expires_at = now() + make_interval(secs => ${ttlMs / 1000})
     WHERE owner = ${instanceId} AND expires_at > now()
    RETURNING lane, fencing_token
  `.execute(db);
  return new Map(rows.map((r) => [r.lane, r.fencing_token]));
}

/**
 * Takes up to `count` lanes that nobody holds or whose lease expired (database clock), raising
 * each one's fencing token. SKIP LOCKED lets instances acquire at the same time without waiting.
 */
export async function acquireLanes(
  db: Executor,
  instanceId: string,
  count: number,
  ttlMs: number,
): Promise<Map<number, number>> {
  if (count <= 0) return new Map();
  const { rows } = await sql<{ lane: number; fencing_token: number }>`
    UPDATE relay_lane l
       SET owner = ${instanceId}, fencing_token = l.fencing_token + 1,
           expires_at = now() + make_interval(secs => ${ttlMs / 1000})
     WHERE l.lane IN (
       SELECT lane FROM relay_lane
        WHERE owner IS NULL OR expires_at <= now()
        ORDER BY lane
        LIMIT ${count}
        FOR UPDATE SKIP LOCKED)
    RETURNING l.lane, l.fencing_token
  `.execute(db);
  return new Map(rows.map((r) => [r.lane, r.fencing_token]));
}

export async function releaseLanes(
  db: Executor,
  instanceId: string,
  lanes: readonly number[],
): Promise<void> {
  if (lanes.length === 0) return;
  await sql`UPDATE relay_lane SET owner = NULL, expires_at = '-infinity'
             WHERE owner = ${instanceId} AND lane = ANY(${lanes}::int[])`.execute(db);
}

export async function forgetInstance(db: Executor, instanceId: string, ttlMs: number): Promise<void> {
  await sql`DELETE FROM relay_instance
             WHERE instance_id = ${instanceId} OR last_seen < now() - make_interval(secs => ${(ttlMs * 10) / 1000})`.execute(
    db,
  );
}

/** Whether commits wait for a synchronous standby here (synchronous_standby_names set and not off/local). */
export async function synchronousReplication(db: Executor): Promise<boolean> {
  const { rows } = await sql<{ on: boolean }>`
    SELECT current_setting('synchronous_standby_names') <> ''
       AND current_setting('synchronous_commit') NOT IN ('off', 'local') AS on`.execute(db);
  return rows[0]!.on;
}

/**
 * A replication barrier: a write that commits only once the synchronous standby has flushed
 * WAL up to it, and so every transaction committed before it. A commit whose wait for the
 * standby was cancelled (pg_terminate_backend, statement_timeout, a driver's cancel) is
 * visible before the standby has it; a relay that published such a row and then lost its
 * primary would have published a transition the promoted standby never saw.
 */
export const replicationBarrier = touchInstance;

/** Records this instance as alive: always a write (an upsert), which the barrier relies on. */
export async function touchInstance(db: Executor, instanceId: string): Promise<void> {
  await sql`INSERT INTO relay_instance (instance_id) VALUES (${instanceId})
            ON CONFLICT (instance_id) DO UPDATE SET last_seen = now()`.execute(db);
}

/**
 * Records this instance as alive, renews its leases and takes its share of the lanes (all of
 * them divided by the live instances): the surplus is released, the shortfall acquired from
 * lanes no one holds. Returns the lanes it holds now, with their fencing tokens.
 */
export async function shareLanes(
  db: Executor,
  o: { instanceId: string; ttlMs: number; log: Logger },
): Promise<Map<number, number>> {
  const live = await heartbeat(db, o.instanceId, o.ttlMs);
  const owned = await renewLanes(db, o.instanceId, o.ttlMs);
  const share = Math.ceil(LANE_COUNT / live);
  if (owned.size > share) {
    const surplus = [...owned.keys()].slice(share);
    await releaseLanes(db, o.instanceId, surplus);
    for (const l of surplus) owned.delete(l);
    o.log.info({ released: surplus, live }, 'released lanes to rebalance');
  } else if (owned.size < share) {
    const got = await acquireLanes(db, o.instanceId, share - owned.size, o.ttlMs);
    for (const [l, t] of got) owned.set(l, t);
    if (got.size > 0) o.log.info({ lanes: [...got.keys()], live }, 'acquired lanes');
  }
  return owned;
}
