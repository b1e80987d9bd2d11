import type { DataClass } from '../db/types.js';
import { CairnError, ValidationError } from '../errors.js';
import type { TaskState } from '../schemas/taskState.js';

/**
 * How sensitive a field is: `public`, `internal`, `confidential` (stored encrypted) or
 * `secret` (never stored).
 */
export type FieldClass = DataClass | 'secret';

/**
 * How sensitive each field of a checkpoint's snapshot is, by path: a top-level TaskState
 * field or `artifacts.<name>`. The most specific entry wins; a field no entry names is
 * confidential (fail closed). `secret` is never stored; `confidential` is always encrypted.
 */
export type Classification = Readonly<Record<string, FieldClass>>;

export const DEFAULT_CLASSIFICATION: Classification = {
  schema_version: 'public',
  status: 'public',
  task_id: 'internal',
  tenant_id: 'internal',
  version: 'internal',
  gates: 'internal',
  budget: 'internal',
  active_agents: 'internal',
  completed_agents: 'internal',
  failed_agents: 'internal',
  updated_at: 'internal',
  updated_by: 'internal',
  workflow_digest: 'internal',
  intent_id: 'internal',
  artifacts: 'confidential',
};

const RANK: Record<DataClass, number> = { public: 0, internal: 1, confidential: 2 };
// A snapshot must stay a valid TaskState: only optional parts (artifacts) may be left out.
const REQUIRED = new Set(Object.keys(DEFAULT_CLASSIFICATION).filter((k) => k !== 'artifacts'));

export function validateClassification(c: Classification): Classification {
  const bad = Object.entries(c).filter(([path, cls]) => cls === 'secret' && REQUIRED.has(path));
  if (bad.length > 0) {
    throw new ValidationError(
      'classification',
      bad.map(([path]) => ({
        path,
        message:
          'is a required TaskState field and cannot be secret (only artifacts.<name> or artifacts can be)',
        value: 'secret',
      })),
    );
  }
  return c;
}

const classOf = (c: Classification, path: string): FieldClass =>
  c[path] ?? (path.startsWith('artifacts.') ? (c.artifacts ?? 'confidential') : 'confidential');

/**
 * What a checkpoint may store of `state`: secret fields removed, and the highest class of
 * what is left (empty values do not count). Names, never values, of the removed fields.
 */
export function classifySnapshot(
  state: TaskState,
  c: Classification,
): { stored: TaskState; dataClass: DataClass; removed: string[] } {
  const removed: string[] = [];
  let top: DataClass = 'public';
  const raise = (cls: DataClass) => {
    if (RANK[cls] > RANK[top]) top = cls;
  };
  const stored: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(state)) {
    if (key === 'artifacts' && value && typeof value === 'object') {
      const kept: Record<string, unknown> = {};
      for (const [name, v] of Object.entries(value)) {
        const cls = classOf(c, `artifacts.${name}`);
        if (cls === 'secret') removed.push(`artifacts.${name}`);
        else {
          kept[name] = v;
          if (v !== undefined && v !== null) raise(cls);
        }
      }
      stored[key] = kept;
      continue;
    }
    const cls = classOf(c, key);
    if (cls === 'secret') {
      if (value !== undefined && value !== null) removed.push(key);
      continue;
    }
    stored[key] = value;
    if (value !== undefined && value !== null) raise(cls);
  }
  return { stored: stored as TaskState, dataClass: top, removed };
}

export function confidentialWithoutKeys(taskId: string): CairnError {
  return new CairnError(
    'encryption_required',
    `checkpoint of task ${taskId} holds confidential fields and this checkpointer has no tenant keys: ` +
      'refusing to store them in the clear (pass keys: createTenantKeys(...) to createCheckpointer)',
  );
}
