import type { Operation } from 'fast-json-patch';
import fjp from 'fast-json-patch';
import { CairnError, CairnErrorCodes } from '../errors.js';

/** An audit row as replay needs it: the RFC 6902 patch from the previous version. */
export interface AuditEntry {
  version: number;
  prev_version: number | null;
  patch: unknown[];
}

/**
 * Rebuilds a task's document by applying its audit patches from the first row. Refuses a
 * history with a gap, since a gap means the log cannot prove the state.
 */
export function replayAudit(entries: readonly AuditEntry[]): Record<string, unknown> {
  let doc: Record<string, unknown> = {};
  let expected = 1;
  for (const e of entries) {
    if (e.version !== expected) {
      throw new CairnError(
        CairnErrorCodes.InvariantViolated,
        `audit history has a gap: expected version ${expected}, found ${e.version}; the log cannot prove the state`,
      );
    }
    doc = fjp.applyPatch(doc, e.patch as Operation[], true, false).newDocument;
    expected++;
  }
  return doc;
}

/**
 * The value as Postgres stores it (JSON): a key whose value is undefined is left out, an
 * undefined array element becomes null. A patch may clear a field with undefined; a document
 * kept in memory with such a key differs from the stored one, and an audit patch diffed from it
 * would replace a path the stored document does not have (its replay then fails).
 */
export function asStored<T>(value: T): T {
  if (Array.isArray(value)) return value.map((v) => (v === undefined ? null : asStored(v))) as T;
  if (value === null || typeof value !== 'object' || !isPlain(value)) return value;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) if (v !== undefined) out[k] = asStored(v);
  return out as T;
}

const isPlain = (v: object) => {
  const proto = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
};

export function diff(prev: object, next: object): Operation[] {
  return fjp.compare(prev, next);
}
