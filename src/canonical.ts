import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';

/** RFC 8785 canonical JSON as bytes: the same value always gives the same bytes, so digests are reproducible. */
export function canonicalBytes(value: unknown): Buffer {
  const text = canonicalize(value);
  if (text === undefined) throw new Error('value cannot be serialized as JSON');
  return Buffer.from(text, 'utf8');
}

export function sha256(bytes: Buffer | string): string {
  return `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
}

/** The digest of a JSON value (null for undefined), as receipts record results. */
export function digestOf(value: unknown): string {
  return sha256(canonicalBytes(value ?? null));
}
