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

export function diff(prev: object, next: object): Operation[] {
  return fjp.compare(prev, next);
}
