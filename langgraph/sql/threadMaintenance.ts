import { sql } from 'kysely';
import type { Db } from '../../src/db/database.js';
import type { Executor } from '../../src/db/executor.js';

/**
 * Deletes every row of a thread (all namespaces); the legal-hold trigger refuses a held one.
 * Under the thread's locks, taken first: a put in progress commits before the delete reads
 * (so nothing it wrote survives), and a put that waited finds its row gone and starts over.
 */
export async function deleteThreadRows(db: Db, tenant: string, thread: string) {
  await db.transaction().execute(async (trx) => {
    await lockThreadRows(trx, tenant, thread);
    await deleteThreadStatement(trx, tenant, thread);
  });
}

function deleteThreadStatement(ex: Executor, tenant: string, thread: string) {
  return sql`
    WITH w AS (DELETE FROM lg_write WHERE tenant_id = ${tenant} AND thread_id = ${thread}),
         b AS (DELETE FROM lg_blob WHERE tenant_id = ${tenant} AND thread_id = ${thread}),
         z AS (DELETE FROM lg_compacted WHERE tenant_id = ${tenant} AND thread_id = ${thread}),
         t AS (DELETE FROM lg_thread WHERE tenant_id = ${tenant} AND thread_id = ${thread})
    DELETE FROM lg_checkpoint WHERE tenant_id = ${tenant} AND thread_id = ${thread}
  `.execute(ex);
}

/** Locks every namespace of a thread against puts (the rows row-level security lets this tenant see). */
export function lockThreadRows(ex: Executor, tenant: string, thread: string) {
  return sql`SELECT 1 FROM lg_thread WHERE tenant_id = ${tenant} AND thread_id = ${thread} FOR UPDATE`.execute(
    ex,
  );
}

/**
 * Removes the named checkpoints with their pending writes, keeping each one's digest (its
 * child's chain still checks). Data-modifying CTEs all run, referenced or not, on one snapshot.
 */
export function compactCheckpoints(
  ex: Executor,
  tenant: string,
  thread: string,
  victims: { ns: string[]; id: string[] },
) {
  return sql<{ removed: string }>`
    WITH victims AS (
      SELECT * FROM unnest(${victims.ns}::text[], ${victims.id}::text[]) AS v (checkpoint_ns, checkpoint_id)
    ), kept AS (
      INSERT INTO lg_compacted (tenant_id, thread_id, checkpoint_ns, checkpoint_id, digest)
      SELECT ${tenant}, ${thread}, c.checkpoint_ns, c.checkpoint_id, c.digest
        FROM lg_checkpoint c JOIN victims v ON v.checkpoint_ns = c.checkpoint_ns AND v.checkpoint_id = c.checkpoint_id
       WHERE c.tenant_id = ${tenant} AND c.thread_id = ${thread}
      ON CONFLICT DO NOTHING
    ), writes AS (
      DELETE FROM lg_write w USING victims v
       WHERE w.tenant_id = ${tenant} AND w.thread_id = ${thread}
         AND w.checkpoint_ns = v.checkpoint_ns AND w.checkpoint_id = v.checkpoint_id
    ), gone AS (
      DELETE FROM lg_checkpoint c USING victims v
       WHERE c.tenant_id = ${tenant} AND c.thread_id = ${thread}
         AND c.checkpoint_ns = v.checkpoint_ns AND c.checkpoint_id = v.checkpoint_id
      RETURNING 1
    )
    SELECT count(*) AS removed FROM gone
  `.execute(ex);
}

/** Blobs of a thread that no remaining checkpoint names (run after compactCheckpoints, in its transaction). */
export function deleteUnreferencedBlobs(ex: Executor, tenant: string, thread: string) {
  return sql`
    DELETE FROM lg_blob b
     WHERE b.tenant_id = ${tenant} AND b.thread_id = ${thread}
       AND NOT EXISTS (
         SELECT 1 FROM lg_checkpoint c
          WHERE c.tenant_id = b.tenant_id AND c.thread_id = b.thread_id AND c.checkpoint_ns = b.checkpoint_ns
            AND c.versions ->> b.channel = b.version)
  `.execute(ex);
}

/**
 * Marks one checkpoint as a boundary (the only column a tenant may update), under the thread's
 * lock: a compaction that already chose what to remove cannot then remove it.
 */
export async function markBoundaryRow(db: Db, tenant: string, thread: string, ns: string, id: string) {
  return db.transaction().execute(async (trx) => {
    await sql`SELECT 1 FROM lg_thread WHERE tenant_id = ${tenant} AND thread_id = ${thread} AND checkpoint_ns = ${ns}
               FOR UPDATE`.execute(trx);
    return sql`
      UPDATE lg_checkpoint SET boundary = true
       WHERE tenant_id = ${tenant} AND thread_id = ${thread} AND checkpoint_ns = ${ns} AND checkpoint_id = ${id}
    `.execute(trx);
  });
}

/** What the saver skipped or refused, one row per checkpoint and kind. */
export type ThreadEventKind = 'skipped_invalid' | 'fork_refused';

/** Records an event for the connection's own tenant (cairn_lg_record: tenants cannot insert events themselves). */
export function recordEvent(
  ex: Executor,
  at: { thread: string; ns: string; checkpointId: string },
  event: ThreadEventKind,
  detail: string,
) {
  return sql`SELECT cairn_lg_record(${at.thread}, ${at.ns}, ${at.checkpointId}, ${event}, ${detail})`.execute(
    ex,
  );
}

/** A checkpoint the saver skipped (it failed verification) or a put it refused, as recorded. */
export interface ThreadEvent {
  threadId: string;
  checkpointNs: string;
  checkpointId: string;
  event: ThreadEventKind;
  reason: string;
  at: Date;
}

/** What the saver skipped or refused in a thread, oldest first. */
export async function listEvents(ex: Executor, tenant: string, thread: string): Promise<ThreadEvent[]> {
  const { rows } = await sql<{
    thread_id: string;
    checkpoint_ns: string;
    checkpoint_id: string;
    event: ThreadEventKind;
    detail: string;
    at: Date;
  }>`
    SELECT thread_id, checkpoint_ns, checkpoint_id, event, detail, at FROM lg_event
     WHERE tenant_id = ${tenant} AND thread_id = ${thread} ORDER BY id
  `.execute(ex);
  return rows.map((r) => ({
    threadId: r.thread_id,
    checkpointNs: r.checkpoint_ns,
    checkpointId: r.checkpoint_id,
    event: r.event,
    reason: r.detail,
    at: r.at,
  }));
}
