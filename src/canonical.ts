import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import { ValidationError } from './errors.js';

/** RFC 8785 canonical JSON as bytes: the same value always gives the same bytes, so digests are reproducible. */
export function canonicalBytes(value: unknown): Buffer {
  const text = canonicalize(value);
  if (text === undefined) {
    throw new ValidationError('value', [
      { path: '', message: 'cannot be serialized as JSON (undefined, a function or a symbol)' },
    ]);
  }
  return Buffer.from(text, 'utf8');
}

export function sha256(bytes: Buffer | string): string {
  return `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
}

/** The digest of a JSON value (null for undefined), as receipts record results. */
export function digestOf(value: unknown): string {
  return sha256(canonicalBytes(value ?? null));
}
