import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';
import type { ThreadScope } from '../integrity.js';

/** What cairn_lg_put did: `ok`, or why it wrote nothing (migrations/0009_langgraph.ts). */
export type PutOutcome =
  | 'ok'
  | 'exists'
  | 'conflict_exists'
  | 'parent_digest'
  | 'fork'
  | 'id_order'
  | 'blob_conflict';

/** The blob rows and the checkpoint row of one put. */
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
    /** The parent's digest as the writer knows it; the function refuses it if it is not the stored one. */
    prevDigest: string | null;
    blobDigests: string;
    sigKey: string | null;
    sig: string | null;
  };
}

/** One put in one round trip: the checks under the thread's lock and the inserts (cairn_lg_put). */
export function putCheckpoint(
  ex: Executor,
  s: ThreadScope,
  writer: { id: string; refuseForks: boolean },
  r: PutRows,
) {
  const b = r.blobs;
  const c = r.checkpoint;
  return sql<{ outcome: PutOutcome; head: string | null; parent_digest: string | null }>`
    SELECT * FROM cairn_lg_put(
      ${s.tenant}, ${s.thread}, ${s.ns}, ${c.id}, ${c.parentId}, ${writer.refuseForks}, ${writer.id}, ${c.prevDigest},
      ${c.bytes}, ${c.type}, ${c.metadata}, ${c.metadataType}, ${c.versions}::jsonb, ${c.metadataJson}::jsonb,
      ${c.blobDigests}::jsonb, ${c.boundary}, ${c.digest}, ${c.sigKey}, ${c.sig},
      ${b.channel}::text[], ${b.version}::text[], ${b.type}::text[], ${b.blob}::bytea[], ${b.key}::text[],
      ${b.digest}::text[], ${b.sigKey}::text[], ${b.sig}::text[])
  `.execute(ex);
}
