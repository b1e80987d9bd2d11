import { ValidationError } from '../errors.js';
import {
  TASK_STATE_V1,
  TASK_STATE_V2,
  type TaskState,
  TaskStateV1,
  TaskStateV2,
  upcastV1,
} from '../schemas/taskState.js';
import { zodIssues } from '../schemas/zodIssues.js';

/**
 * Reads a stored document by its schema_version: v2 as is, v1 through the explicit
 * upcaster. A document that matches neither is refused, never patched up.
 */
export function parseStoredTaskState(row: {
  task_id: string;
  tenant_id: string;
  version?: number;
  doc: unknown;
}): TaskState {
  const doc = row.doc as { schema_version?: unknown; version?: unknown } | null;
  if (row.version !== undefined && doc?.version !== row.version) {
    throw new ValidationError(`stored task ${row.task_id}`, [
      {
        path: 'version',
        message: `the document says ${String(doc?.version)} but the row says ${row.version}: the row was changed outside Cairn; restore it from the audit log`,
        value: doc?.version,
      },
    ]);
  }
  // The document's identity is the row's (a CHECK says so since migration 0008; rows from
  // before it are checked here): a document naming another task or tenant is refused.
  const ids = doc as { task_id?: unknown; tenant_id?: unknown } | null;
  for (const [field, expected] of [
    ['task_id', row.task_id],
    ['tenant_id', row.tenant_id],
  ] as const) {
    const got = ids?.[field];
    if (got !== undefined && got !== expected) {
      throw new ValidationError(`stored task ${row.task_id}`, [
        {
          path: field,
          message: `the document says ${String(got)} but the row says ${expected}: the row was changed outside Cairn`,
          value: got,
        },
      ]);
    }
  }
  const version = doc?.schema_version;
  if (version === TASK_STATE_V2) {
    const r = TaskStateV2.safeParse(doc);
    if (r.success) return r.data;
    throw new ValidationError(`stored task ${row.task_id} (${TASK_STATE_V2})`, zodIssues(r.error, doc));
  }
  if (version === TASK_STATE_V1) {
    const r = TaskStateV1.safeParse(doc);
    if (r.success) return upcastV1(r.data, row.tenant_id);
    throw new ValidationError(`stored task ${row.task_id} (${TASK_STATE_V1})`, zodIssues(r.error, doc));
  }
  throw new ValidationError(`stored task ${row.task_id}`, [
    {
      path: 'schema_version',
      message: `unknown schema version; this Cairn reads ${TASK_STATE_V1} and ${TASK_STATE_V2}`,
      value: version,
    },
  ]);
}
