import { type RawBuilder, sql } from 'kysely';
import type { Executor } from '../src/db/executor.js';
import type { ThreadScope } from './integrity.js';

/** A checkpoint row as the reads below return it, with its blobs and pending writes. */
export interface CheckpointRow {
  thread_id: string;
  checkpoint_ns: string;
  checkpoint_id: string;
  parent_checkpoint_id: string | null;
  checkpoint: Buffer;
  checkpoint_type: string;
  metadata: Buffer;
  metadata_type: string;
  digest: string;
  prev_digest: string | null;
  sig_key: string | null;
  sig: string | null;
  /** The parent's digest (or the one compaction kept); null when no parent row is there. */
  parent_digest: string | null;
  b_channel: string[] | null;
  b_version: string[] | null;
  b_type: string[] | null;
  b_blob: Array<Buffer | null> | null;
  b_key: Array<string | null> | null;
  b_digest: string[] | null;
  b_sig_key: Array<string | null> | null;
  b_sig: Array<string | null> | null;
  w_task: string[] | null;
  w_idx: number[] | null;
  w_path: string[] | null;
  w_channel: string[] | null;
  w_type: string[] | null;
  w_blob: Buffer[] | null;
  w_key: Array<string | null> | null;
  w_digest: string[] | null;
  w_sig_key: Array<string | null> | null;
  w_sig: Array<string | null> | null;
}

/**
 * Checkpoints with their blobs and pending writes in one round trip (the shape of LangGraph's
 * own Postgres saver): the blobs are those named by the row's channel versions, the writes
 * come in writesSortKey order (task path, task id, index; "C" collation compares code points).
 * Every predicate carries the tenant: for a tenant's role row-level security says the same,
 * for the owner (who bypasses it) this is what keeps tenants apart.
 */
export function selectCheckpoints(where: RawBuilder<unknown>, tail: RawBuilder<unknown>) {
  return sql<CheckpointRow>`
    SELECT cp.thread_id, cp.checkpoint_ns, cp.checkpoint_id, cp.parent_checkpoint_id, cp.checkpoint,
           cp.checkpoint_type, cp.metadata, cp.metadata_type, cp.digest, cp.prev_digest, cp.sig_key, cp.sig,
           coalesce(p.digest, z.digest) AS parent_digest,
           b.*, w.*
      FROM lg_checkpoint cp
      LEFT JOIN lg_checkpoint p
        ON p.tenant_id = cp.tenant_id AND p.thread_id = cp.thread_id AND p.checkpoint_ns = cp.checkpoint_ns
       AND p.checkpoint_id = cp.parent_checkpoint_id
      LEFT JOIN lg_compacted z
        ON z.tenant_id = cp.tenant_id AND z.thread_id = cp.thread_id AND z.checkpoint_ns = cp.checkpoint_ns
       AND z.checkpoint_id = cp.parent_checkpoint_id
      CROSS JOIN LATERAL (
        SELECT array_agg(bl.channel) AS b_channel, array_agg(bl.version) AS b_version, array_agg(bl.type) AS b_type,
               array_agg(bl.blob) AS b_blob, array_agg(bl.key_id) AS b_key, array_agg(bl.digest) AS b_digest,
               array_agg(bl.sig_key) AS b_sig_key, array_agg(bl.sig) AS b_sig
          FROM jsonb_each_text(cp.versions) v
          JOIN lg_blob bl
            ON bl.tenant_id = cp.tenant_id AND bl.thread_id = cp.thread_id AND bl.checkpoint_ns = cp.checkpoint_ns
           AND bl.channel = v.key AND bl.version = v.value
      ) b
      CROSS JOIN LATERAL (
        SELECT array_agg(cw.task_id ORDER BY cw.task_path COLLATE "C", cw.task_id COLLATE "C", cw.idx) AS w_task,
               array_agg(cw.idx ORDER BY cw.task_path COLLATE "C", cw.task_id COLLATE "C", cw.idx) AS w_idx,
               array_agg(cw.task_path ORDER BY cw.task_path COLLATE "C", cw.task_id COLLATE "C", cw.idx) AS w_path,
               array_agg(cw.channel ORDER BY cw.task_path COLLATE "C", cw.task_id COLLATE "C", cw.idx) AS w_channel,
               array_agg(cw.type ORDER BY cw.task_path COLLATE "C", cw.task_id COLLATE "C", cw.idx) AS w_type,
               array_agg(cw.blob ORDER BY cw.task_path COLLATE "C", cw.task_id COLLATE "C", cw.idx) AS w_blob,
               array_agg(cw.key_id ORDER BY cw.task_path COLLATE "C", cw.task_id COLLATE "C", cw.idx) AS w_key,
               array_agg(cw.digest ORDER BY cw.task_path COLLATE "C", cw.task_id COLLATE "C", cw.idx) AS w_digest,
               array_agg(cw.sig_key ORDER BY cw.task_path COLLATE "C", cw.task_id COLLATE "C", cw.idx) AS w_sig_key,
               array_agg(cw.sig ORDER BY cw.task_path COLLATE "C", cw.task_id COLLATE "C", cw.idx) AS w_sig
          FROM lg_write cw
         WHERE cw.tenant_id = cp.tenant_id AND cw.thread_id = cp.thread_id AND cw.checkpoint_ns = cp.checkpoint_ns
           AND cw.checkpoint_id = cp.checkpoint_id
      ) w
     WHERE ${where}
     ${tail}
  `;
}

/**
 * Serializes puts to one thread and namespace for the rest of the transaction. Its own
 * statement on purpose: a statement's snapshot is taken before it waits for a lock, so the
 * head must be read by the next statement, which sees whatever the previous holder committed.
 */
export function lockThread(trx: Executor, s: ThreadScope) {
  return sql`SELECT pg_advisory_xact_lock(hashtextextended(${`cairn.langgraph\n${s.tenant}\n${s.thread}\n${s.ns}`}, 0))`.execute(
    trx,
  );
}

/** The thread's head, the declared parent's digest and the digest of a row already under this id. */
export function readHead(trx: Executor, s: ThreadScope, parentId: string | null, id: string) {
  return sql<{ head: string | null; parent_digest: string | null; existing_digest: string | null }>`
    SELECT
      (SELECT checkpoint_id FROM lg_checkpoint
        WHERE tenant_id = ${s.tenant} AND thread_id = ${s.thread} AND checkpoint_ns = ${s.ns}
        ORDER BY checkpoint_id DESC LIMIT 1) AS head,
      (SELECT coalesce(
         (SELECT digest FROM lg_checkpoint
           WHERE tenant_id = ${s.tenant} AND thread_id = ${s.thread} AND checkpoint_ns = ${s.ns} AND checkpoint_id = ${parentId}),
         (SELECT digest FROM lg_compacted
           WHERE tenant_id = ${s.tenant} AND thread_id = ${s.thread} AND checkpoint_ns = ${s.ns} AND checkpoint_id = ${parentId}))
      ) AS parent_digest,
      (SELECT digest FROM lg_checkpoint
        WHERE tenant_id = ${s.tenant} AND thread_id = ${s.thread} AND checkpoint_ns = ${s.ns} AND checkpoint_id = ${id}) AS existing_digest
  `.execute(trx);
}

/** The blob rows and the checkpoint row of one put, in one statement. */
export interface PutRows {
  blobs: {
    channel: string[];
    version: string[];
    type: string[];
    blob: Array<Buffer | null>;
    key: Array<string | null>;
    digest: string[];
    sigKey: Array<string | null>;
    sig: Array<string | null>;
  };
  checkpoint: {
    id: string;
    parentId: string | null;
    bytes: Buffer;
    type: string;
    metadata: Buffer;
    metadataType: string;
    versions: string;
    metadataJson: string;
    boundary: boolean;
    digest: string;
    prevDigest: string | null;
    sigKey: string | null;
    sig: string | null;
  };
}

export function insertPut(trx: Executor, s: ThreadScope, r: PutRows) {
  const b = r.blobs;
  const c = r.checkpoint;
  return sql`
    WITH blobs AS (
      INSERT INTO lg_blob (tenant_id, thread_id, checkpoint_ns, channel, version, type, blob, key_id, digest, sig_key, sig)
      SELECT ${s.tenant}, ${s.thread}, ${s.ns}, u.* FROM unnest(
        ${b.channel}::text[], ${b.version}::text[], ${b.type}::text[], ${b.blob}::bytea[], ${b.key}::text[],
        ${b.digest}::text[], ${b.sigKey}::text[], ${b.sig}::text[]) AS u
      ON CONFLICT DO NOTHING
    )
    INSERT INTO lg_checkpoint (tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint,
                               checkpoint_type, metadata, metadata_type, versions, metadata_json, boundary, digest,
                               prev_digest, sig_key, sig)
    VALUES (${s.tenant}, ${s.thread}, ${s.ns}, ${c.id}, ${c.parentId}, ${c.bytes}, ${c.type}, ${c.metadata},
            ${c.metadataType}, ${c.versions}::jsonb, ${c.metadataJson}::jsonb, ${c.boundary}, ${c.digest},
            ${c.prevDigest}, ${c.sigKey}, ${c.sig})
  `.execute(trx);
}

/** Pending writes of one task; special channels (errors, interrupts) replace what was there. */
export function insertWrites(
  ex: Executor,
  s: ThreadScope,
  checkpointId: string,
  w: {
    taskId: string;
    taskPath: string;
    idx: number[];
    channel: string[];
    type: string[];
    blob: Buffer[];
    key: Array<string | null>;
    digest: string[];
    sigKey: Array<string | null>;
    sig: Array<string | null>;
  },
  upsert: boolean,
) {
  const onConflict = upsert
    ? sql`ON CONFLICT (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
          task_path = EXCLUDED.task_path, channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob,
          key_id = EXCLUDED.key_id, digest = EXCLUDED.digest, sig_key = EXCLUDED.sig_key, sig = EXCLUDED.sig`
    : sql`ON CONFLICT DO NOTHING`;
  return sql`
    INSERT INTO lg_write (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob,
                          key_id, digest, sig_key, sig)
    SELECT ${s.tenant}, ${s.thread}, ${s.ns}, ${checkpointId}, ${w.taskId}, ${w.taskPath}, u.* FROM unnest(
      ${w.idx}::int[], ${w.channel}::text[], ${w.type}::text[], ${w.blob}::bytea[], ${w.key}::text[],
      ${w.digest}::text[], ${w.sigKey}::text[], ${w.sig}::text[]) AS u
    ${onConflict}
  `.execute(ex);
}

/** The pending sends (TASKS writes) of parent checkpoints, for checkpoints older than format 4. */
export interface WriteRow {
  checkpoint_id: string;
  task_id: string;
  idx: number;
  task_path: string;
  channel: string;
  type: string;
  blob: Buffer;
  key_id: string | null;
  digest: string;
  sig_key: string | null;
  sig: string | null;
}

export function selectPendingSends(s: ThreadScope, channel: string, parents: string[]) {
  return sql<WriteRow>`
    SELECT checkpoint_id, task_id, idx, task_path, channel, type, blob, key_id, digest, sig_key, sig FROM lg_write
     WHERE tenant_id = ${s.tenant} AND thread_id = ${s.thread} AND checkpoint_ns = ${s.ns}
       AND checkpoint_id = ANY(${parents}::text[]) AND channel = ${channel}
     ORDER BY checkpoint_id, task_path COLLATE "C", task_id COLLATE "C", idx
  `;
}
