import { createHmac, timingSafeEqual } from 'node:crypto';
import { canonicalBytes } from '../canonical.js';
import { CairnError, CairnErrorCodes } from '../errors.js';
import type { Checkpoint } from './schema.js';

/** Signing keys by id; `current` signs, every key in `keys` verifies (so keys can rotate). */
export interface KeyRing {
  current: string;
  keys: Readonly<Record<string, Buffer>>;
}

/** An HMAC over canonical bytes and the key that made it (checkpoints, changelog records). */
export interface Signature {
  alg: 'HMAC-SHA256';
  key_id: string;
  value: string;
}

/** Signs `bytes` with the ring's current key. */
export function signBytes(bytes: Buffer, ring: KeyRing): Signature {
  const key = ring.keys[ring.current];
  if (!key) {
    throw new CairnError(
      CairnErrorCodes.KeyMissing,
      `signing key ${ring.current} is not in the key ring (it has ${Object.keys(ring.keys).join(', ') || 'none'}): set \`current\` to one of its keys`,
    );
  }
  return {
    alg: 'HMAC-SHA256',
    key_id: ring.current,
    value: createHmac('sha256', key).update(bytes).digest('base64url'),
  };
}

/**
 * Checks a signature over `bytes` against the ring; `what` names the signed thing in the
 * message. Unsigned is refused when a ring is configured; without a ring, anything passes.
 */
export function verifyBytes(
  bytes: Buffer,
  sig: Signature | undefined,
  ring: KeyRing | undefined,
  what: string,
): { ok: true } | { ok: false; message: string; unknownKey?: true } {
  if (!sig)
    return ring ? { ok: false, message: `${what} is not signed but a key ring is configured` } : { ok: true };
  if (!ring) return { ok: true };
  const key = ring.keys[sig.key_id];
  // A key the ring does not hold (left out after a rotation, a secret store that did not give
  // it): nothing can be concluded about the signature, which may well be good.
  if (!key)
    return {
      ok: false,
      unknownKey: true,
      message: `signature key ${sig.key_id} is not in the current key ring (it has ${Object.keys(ring.keys).join(', ') || 'none'})`,
    };
  const expected = createHmac('sha256', key).update(bytes).digest();
  const got = Buffer.from(String(sig.value), 'base64url');
  return got.length === expected.length && timingSafeEqual(got, expected)
    ? { ok: true }
    : { ok: false, message: `signature does not match (key ${sig.key_id})` };
}

/** The bytes a signature covers: the canonical checkpoint without its signature. */
export function signedBytes(cp: Checkpoint): Buffer {
  const { signature: _s, ...integrity } = cp.integrity;
  return canonicalBytes({ ...cp, integrity });
}

export function sign(cp: Checkpoint, ring: KeyRing): NonNullable<Checkpoint['integrity']['signature']> {
  return signBytes(signedBytes(cp), ring);
}

export function verifySignature(
  cp: Checkpoint,
  ring: KeyRing | undefined,
): { ok: true } | { ok: false; message: string; unknownKey?: true } {
  return verifyBytes(signedBytes(cp), cp.integrity.signature, ring, 'checkpoint');
}
