import { sql } from 'kysely';
import type { Db } from '../../src/db/database.js';
import type { ClaimedRow } from '../sql/claimBatch.js';
import { lsnOf, lsnText, type StreamRow } from './walRows.js';

/**
 * Writes WAL messages (rows of no table, `emitted`) into the outbox table, in the order given,
 * and makes them rows: their ids become the table's, `emitted` goes. For a message that must
 * wait (its key parked, its lane held or owned by another relay) before the slot is confirmed
 * past it: from then on the table keeps it, like any row, until it is published or skipped.
 *
 * A message written before (the stream read again from the slot after a restart) keeps its
 * row: the same message id and tenant is one moved row (`from_wal`, migration 0019: a tenant's
 * own row with that id is another, and never waited on). Its task is not
 * checked again (it was when the message was written; it may be deleted since): the session
 * says so to migration 0019's task trigger, which believes it of the outbox's owner only.
 */
export async function writeToTable(db: Db, rows: readonly ClaimedRow[]): Promise<void> {
  const messages = rows.filter((r): r is StreamRow => r.emitted === true);
  if (messages.length === 0) return;
  const seen = new Map<string, ClaimedRow>();
  for (const r of messages) seen.set(`${r.tenant_id ?? ''}\u0000${r.message_id}`, r);
  const values = [...seen.values()].map(
    (r) =>
      sql`(${r.lane}, ${r.message_id}::uuid, ${r.tenant_id}, ${r.task_id}, ${r.task_version}::bigint, ${r.task_seq}::int,
           ${r.topic}, ${r.key}, ${JSON.stringify(r.headers ?? {})}::jsonb, ${r.payload},
           ${Number.isFinite(r.created_ms) ? new Date(r.created_ms).toISOString() : 'infinity'}::timestamptz, true)`,
  );
  const lastLsn = messages.reduce<bigint>((m, r) => {
    const l = lsnOf(r.walLsn) ?? 0n;
    return l > m ? l : m;
  }, 0n);
  const ids = await db.transaction().execute(async (trx) => {
    // Nothing here waits on a tenant's transaction (from_wal rows are the relay's alone); the
    // timeout bounds what else could hold the slot's reader: the step fails and reads it again.
    await sql`SELECT set_config('cairn.relay_moves_wal_messages', 'on', true), set_config('lock_timeout', '5s', true)`.execute(
      trx,
    );
    const { rows: written } = await sql<{ id: string; message_id: string; tenant: string }>`
      INSERT INTO outbox (lane, message_id, tenant_id, task_id, task_version, task_seq, topic, key, headers, payload, created_at, from_wal)
      VALUES ${sql.join(values)}
      ON CONFLICT ((coalesce(tenant_id, '')), message_id) WHERE from_wal DO UPDATE SET attempts = outbox.attempts
      RETURNING id::text AS id, message_id::text AS message_id, coalesce(tenant_id, '') AS tenant`.execute(
      trx,
    );
    // Read again from the slot (its position is saved at checkpoints: a crash goes back): what
    // an operator skipped since it was first moved stays skipped. Its row goes again at once;
    // a park at it then parks nothing (relay/sql/parkKey.ts), the sweep finds nothing to send.
    await sql`
      DELETE FROM outbox o USING outbox_operator_audit a
       WHERE o.id = ANY(${written.map((w) => w.id)}::bigint[]) AND o.from_wal
         AND a.action = 'skip' AND a.message_id = o.message_id AND coalesce(a.tenant, '') = coalesce(o.tenant_id, '')`.execute(
      trx,
    );
    if (lastLsn > 0n) {
      await sql`UPDATE outbox_wal_reader SET moved_lsn = greatest(moved_lsn, ${lsnText(lastLsn)}::pg_lsn)`.execute(
        trx,
      );
    }
    return new Map(written.map((w) => [`${w.tenant}\u0000${w.message_id}`, Number(w.id)]));
  });
  for (const r of messages) {
    r.id = ids.get(`${r.tenant_id ?? ''}\u0000${r.message_id}`)!;
    delete r.emitted;
  }
}
