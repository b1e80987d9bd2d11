import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';
import type { ThreadScope } from '../integrity.js';

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
    blobDigests: string;
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
                               prev_digest, blob_digests, sig_key, sig)
    VALUES (${s.tenant}, ${s.thread}, ${s.ns}, ${c.id}, ${c.parentId}, ${c.bytes}, ${c.type}, ${c.metadata},
            ${c.metadataType}, ${c.versions}::jsonb, ${c.metadataJson}::jsonb, ${c.boundary}, ${c.digest},
            ${c.prevDigest}, ${c.blobDigests}::jsonb, ${c.sigKey}, ${c.sig})
  `.execute(trx);
}
