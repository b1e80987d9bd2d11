import { describe, expect, it } from 'vitest';
import {
  classifySnapshot,
  DEFAULT_CLASSIFICATION,
  validateClassification,
} from '../../src/checkpoints/classification.js';
import type { TaskState } from '../../src/schemas/taskState.js';

const state = (artifacts: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
  ({
    task_id: 't',
    tenant_id: 'a',
    status: 'planning',
    version: 1,
    artifacts,
    ...extra,
  }) as unknown as TaskState;

describe('checkpoint field classification', () => {
  it('the class is the highest of what is stored; empty values do not count', () => {
    expect(classifySnapshot(state({}), DEFAULT_CLASSIFICATION).dataClass).toBe('internal');
    expect(classifySnapshot(state({ implementation_plan: 's3://x' }), DEFAULT_CLASSIFICATION).dataClass).toBe(
      'confidential',
    );
    expect(
      classifySnapshot(state({}), {
        ...DEFAULT_CLASSIFICATION,
        task_id: 'public',
        tenant_id: 'public',
        version: 'public',
      }).dataClass,
    ).toBe('public');
  });

  it('secret fields are removed (by name, never echoing the value); unknown fields are confidential', () => {
    const c = { ...DEFAULT_CLASSIFICATION, 'artifacts.review_report': 'secret' as const };
    const r = classifySnapshot(state({ review_report: 's3://secret', code_files: [] }), c);
    expect(r.removed).toEqual(['artifacts.review_report']);
    expect(r.stored.artifacts).toEqual({ code_files: [] });
    expect(JSON.stringify(r.removed)).not.toContain('s3://secret');
    expect(classifySnapshot(state({}, { something_new: 1 }), DEFAULT_CLASSIFICATION).dataClass).toBe(
      'confidential',
    );
  });

  it('a required TaskState field cannot be classified secret', () => {
    expect(() => validateClassification({ budget: 'secret' })).toThrow(
      /budget: is a required TaskState field/,
    );
    expect(validateClassification({ 'artifacts.test_results': 'secret' })).toBeTruthy();
  });
});
