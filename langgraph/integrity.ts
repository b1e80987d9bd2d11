import { createHmac, timingSafeEqual } from 'node:crypto';
import { canonicalBytes, sha256 } from '../src/canonical.js';
import type { KeyRing } from '../src/checkpoints/signing.js';
import { CairnError, CairnErrorCodes, UnavailableError } from '../src/errors.js';

/** Where a row lives: its tenant ('' for none), thread and namespace. Every digest binds them. */
export interface ThreadScope {
  tenant: string;
  thread: string;
  ns: string;
}

/** The serializer's bytes of a value, with the type it gave them (null bytes: LangGraph's "empty"). */
export interface TypedBytes {
  type: string;
  bytes: Buffer | null;
}

const bytesDigest = (b: Buffer | null) => (b === null ? null : sha256(b));

/**
 * The digest of a channel value: its bytes and the identity LangGraph reads it under (tenant,
 * thread, namespace, channel, version), so a row copied to another place does not verify.
 */
export function blobDigest(s: ThreadScope, channel: string, version: string, v: TypedBytes): string {
  return sha256(
    canonicalBytes({
      k: 'lg.blob',
      t: s.tenant,
      th: s.thread,
      ns: s.ns,
      ch: channel,
      v: version,
      ty: v.type,
      b: bytesDigest(v.bytes),
    }),
  );
}

/** The digest of a pending write, bound to its checkpoint, task, index and task path. */
export function writeDigest(
  s: ThreadScope,
  at: { checkpointId: string; taskId: string; idx: number; taskPath: string; channel: string },
  v: TypedBytes,
): string {
  return sha256(
    canonicalBytes({
      k: 'lg.write',
      t: s.tenant,
      th: s.thread,
      ns: s.ns,
      id: at.checkpointId,
      task: at.taskId,
      i: at.idx,
      p: at.taskPath,
      ch: at.channel,
      ty: v.type,
      b: bytesDigest(v.bytes),
    }),
  );
}

/** The digest of a checkpoint row: its bytes, its parent and the parent's digest (the chain). */
export function checkpointDigest(
  s: ThreadScope,
  at: {
    checkpointId: string;
    parentId: string | null;
    prevDigest: string | null;
    /** The blobs this put wrote: channel -> [version, digest]. */
    blobs: Record<string, [string, string]>;
  },
  checkpoint: TypedBytes,
  metadata: TypedBytes,
): string {
  return sha256(
    canonicalBytes({
      k: 'lg.checkpoint',
      t: s.tenant,
      th: s.thread,
      ns: s.ns,
      id: at.checkpointId,
      parent: at.parentId,
      prev: at.prevDigest,
      blobs: at.blobs,
      cp: [checkpoint.type, bytesDigest(checkpoint.bytes)],
      md: [metadata.type, bytesDigest(metadata.bytes)],
    }),
  );
}

const utf8 = new TextDecoder();

/**
 * The metadata as the JSON that list filters read (`metadata_json`): the serializer's JSON
 * with NUL escapes dropped (jsonb refuses them); `{}` for metadata another serializer wrote.
 */
export function metadataJsonText(md: TypedBytes): string {
  if (md.type !== 'json' || !md.bytes) return '{}';
  const text = utf8.decode(md.bytes);
  // Parsed, not edited as text: a string holding a backslash and "u0000" must survive.
  return text.includes('\\u0000')
    ? JSON.stringify(JSON.parse(text), (_k, v) => (typeof v === 'string' ? v.replaceAll('\u0000', '') : v))
    : text;
}

/** A row's signature: an HMAC of its digest under the ring's current key. */
export interface RowSignature {
  sigKey: string | null;
  sig: string | null;
}

/** The HMAC covers the digest and the id of the data key the stored bytes are sealed with (not in the digest, which is of the plaintext). */
const mac = (key: Buffer, digest: string, keyId: string | null) =>
  createHmac('sha256', key)
    .update(`cairn.langgraph\n${digest}\n${keyId ?? ''}`)
    .digest();

export function signDigest(
  digest: string,
  ring: KeyRing | undefined,
  keyId: string | null = null,
): RowSignature {
  if (!ring) return { sigKey: null, sig: null };
  const key = ring.keys[ring.current];
  if (!key) {
    throw new CairnError(
      CairnErrorCodes.KeyMissing,
      `signing key ${ring.current} is not in the key ring (it has ${Object.keys(ring.keys).join(', ') || 'none'}): set \`current\` to one of its keys`,
    );
  }
  return { sigKey: ring.current, sig: mac(key, digest, keyId).toString('base64url') };
}

/** Undefined when the row's signature holds (or no ring is configured), else what is wrong. */
export function signatureProblem(
  digest: string,
  s: RowSignature,
  ring: KeyRing | undefined,
  keyId: string | null = null,
): string | undefined {
  if (!ring) return undefined;
  if (!s.sig || !s.sigKey) return 'not signed but a key ring is configured';
  const key = ring.keys[s.sigKey];
  // A key the ring does not hold (left out after a rotation): nothing can be concluded about
  // the row, which may well be good; an outage of configuration, never taken for corruption.
  if (!key)
    throw new UnavailableError(
      `signed with key ${s.sigKey}, which is not in the key ring (it has ${Object.keys(ring.keys).join(', ') || 'none'}): add the key to the ring`,
    );
  const got = Buffer.from(s.sig, 'base64url');
  const want = mac(key, digest, keyId);
  return got.length === want.length && timingSafeEqual(got, want)
    ? undefined
    : `signature does not match (key ${s.sigKey})`;
}
