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

/** Why cairn_lg_put wrote nothing, for the error and the event (every outcome but ok and exists). */
export function refusalOf(
  r: { outcome: PutOutcome; head: string | null; parent_digest: string | null },
  at: { thread: string; id: string; parentId: string | null },
): string {
  switch (r.outcome) {
    case 'parent_digest':
      return r.parent_digest === null
        ? `the parent ${at.parentId} of thread ${at.thread} is gone`
        : `the parent ${at.parentId} of thread ${at.thread} is not the checkpoint this saver saw (its digest changed)`;
    case 'blob_conflict':
      return `another value is already stored under a channel version this put writes in thread ${at.thread} (a fork that counted versions the same way)`;
    case 'conflict_exists':
      return `checkpoint ${at.id} already exists in thread ${at.thread} with other content; checkpoints are never overwritten`;
    case 'fork':
      // The put's parent is no longer the head (another writer moved the thread since this one
      // read it), or a put without a parent came to a thread whose head another writer wrote.
      return at.parentId === null
        ? `thread ${at.thread} already has checkpoint ${r.head}, written by another writer: a put without a parent would start a second history`
        : `the parent ${at.parentId} is not the head of thread ${at.thread} (${r.head ?? 'none'}): another writer moved it, or this is a fork from an older checkpoint (forks: 'allow' permits them)`;
    case 'id_order':
      return `checkpoint ${at.id} does not sort after the head ${r.head} of thread ${at.thread}: ids must grow along a thread`;
    default:
      return `unexpected outcome ${r.outcome}`;
  }
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
