import { type RawBuilder, sql } from 'kysely';
import { PREPARED } from '../../src/db/pool.js';

/** A checkpoint row as selectCheckpoints returns it, with its blobs and pending writes. */
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
  blob_digests: Record<string, [string, string]>;
  /** A retention hint outside the digest (markBoundary may set it). */
  boundary: boolean;
  /** SQL copies of what the bytes hold; verify checks they agree. */
  versions: Record<string, unknown>;
  metadata_json: unknown;
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
export function selectCheckpoints(
  where: RawBuilder<unknown>,
  tail: RawBuilder<unknown>,
  o: { prepared?: boolean } = {},
) {
  return sql<CheckpointRow>`${sql.raw(o.prepared ? PREPARED : '')}
    SELECT cp.thread_id, cp.checkpoint_ns, cp.checkpoint_id, cp.parent_checkpoint_id, cp.checkpoint,
           cp.checkpoint_type, cp.metadata, cp.metadata_type, cp.digest, cp.prev_digest, cp.blob_digests, cp.boundary, cp.versions, cp.metadata_json, cp.sig_key, cp.sig,
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
          FROM cairn_lg_versions(cp.versions) v
          JOIN lg_blob bl
            ON bl.tenant_id = cp.tenant_id AND bl.thread_id = cp.thread_id AND bl.checkpoint_ns = cp.checkpoint_ns
           AND bl.channel = v.channel AND bl.version = v.version
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
