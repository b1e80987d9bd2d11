import { describe, expect, it } from 'vitest';
import { ValidationError } from '../../src/errors.js';
import { TaskPatch } from '../../src/schemas/taskPatch.js';
import { SpiffeId, TaskStateV1, TaskStateV2, upcastV1 } from '../../src/schemas/taskState.js';
import { parseStoredTaskState } from '../../src/state/parseStored.js';
import { diff, replayAudit } from '../../src/state/replay.js';
import { assertChangeAllowed } from '../../src/state/rules.js';
import { canTransition, DEFAULT_REQUIRED_GATES, TRANSITIONS } from '../../src/state/transitions.js';

const base = {
  schema_version: 'oaies.task-state.v2' as const,
  tenant_id: 'acme',
  task_id: 't-1',
  version: 1,
  status: 'planning' as const,
  gates: {
    plan_approved: false,
    implementation_complete: false,
    review_passed: false,
    tests_passing: false,
    security_approved: false,
    deployment_approved: false,
  },
  artifacts: {},
  active_agents: [],
  completed_agents: [],
  failed_agents: [],
  budget: { currency_committed_usd: 10, currency_spent_usd: 1, tokens_spent: 5, hops_used: 1 },
  workflow_digest: `sha256:${'0'.repeat(64)}`,
  intent_id: 'i-1',
  updated_at: '2026-11-29T10:00:00.000Z',
  updated_by: 'spiffe://acme.example/agents/a',
};

describe('TaskState schema', () => {
  it('accepts a complete v2 document', () => {
    expect(TaskStateV2.parse(base)).toEqual(base);
  });

  it('refuses unknown keys at the top level and in gates, naming them', () => {
    const top = TaskStateV2.safeParse({ ...base, secret_notes: 'x' });
    expect(top.success).toBe(false);
    expect(JSON.stringify(top.error?.issues)).toContain('secret_notes');
    const gate = TaskPatch.safeParse({ gates: { plan_aproved: true } });
    expect(gate.success).toBe(false);
    expect(JSON.stringify(gate.error?.issues)).toContain('plan_aproved');
  });

  it('refuses bad SPIFFE IDs and accepts good ones', () => {
    for (const bad of [
      'agent-7',
      'spiffe://',
      'spiffe://Acme.example/a',
      'spiffe://acme.example',
      'https://acme/x',
    ]) {
      expect(SpiffeId.safeParse(bad).success, bad).toBe(false);
    }
    expect(SpiffeId.safeParse('spiffe://acme.example/ns/prod/sa/planner').success).toBe(true);
  });

  it('upcasts v1 to v2 explicitly: zero budget (fail closed), unknown digest and intent as null', () => {
    const { budget: _b, workflow_digest: _w, intent_id: _i, ...rest } = base;
    const v1 = TaskStateV1.parse({ ...rest, schema_version: 'oaies.task-state.v1' });
    const v2 = upcastV1(v1, 'acme');
    expect(TaskStateV2.parse(v2)).toMatchObject({
      schema_version: 'oaies.task-state.v2',
      budget: { currency_committed_usd: 0, currency_spent_usd: 0, tokens_spent: 0, hops_used: 0 },
      workflow_digest: null,
      intent_id: null,
    });
  });

  it('refuses a stored document with an unknown schema_version, naming the value', () => {
    expect(() =>
      parseStoredTaskState({
        task_id: base.task_id,
        tenant_id: base.tenant_id,
        doc: { ...base, schema_version: 'oaies.task-state.v9' },
      }),
    ).toThrow(/schema_version: unknown schema version.*got "oaies.task-state.v9"/);
  });
});

it("refuses a stored document whose task or tenant is not its row's, naming the field", () => {
  expect(() => parseStoredTaskState({ task_id: base.task_id, tenant_id: 'other', doc: base })).toThrow(
    /tenant_id: the document says acme but the row says other/,
  );
});

describe('state machine rules', () => {
  const opts = { requiredGates: DEFAULT_REQUIRED_GATES };

  it('declares no transition out of a terminal state', () => {
    for (const s of ['complete', 'failed', 'cancelled', 'expired'] as const)
      expect(TRANSITIONS[s]).toEqual([]);
    expect(canTransition('complete', 'complete')).toBe(false);
  });

  it('refuses an undeclared transition with the allowed list', () => {
    expect(() => assertChangeAllowed(base, { ...base, status: 'testing' }, opts)).toThrow(
      /cannot move from planning to testing; declared transitions from planning: implementing, failed, cancelled, expired/,
    );
  });

  it('refuses complete while required gates are false, naming them', () => {
    const testing = { ...base, status: 'testing' as const };
    expect(() => assertChangeAllowed(testing, { ...testing, status: 'complete' }, opts)).toThrow(
      /status: complete requires the gates .*false: plan_approved, implementation_complete, review_passed, tests_passing/,
    );
  });

  it('refuses a gate flipping back to false without a reason, allows it with one', () => {
    const approved = { ...base, gates: { ...base.gates, plan_approved: true } };
    const back = { ...approved, gates: { ...approved.gates, plan_approved: false } };
    expect(() => assertChangeAllowed(approved, back, opts)).toThrow(ValidationError);
    expect(() => assertChangeAllowed(approved, back, opts)).toThrow(
      /gates\.plan_approved: .*explicit reason/,
    );
    expect(() =>
      assertChangeAllowed(approved, back, { ...opts, reason: 'plan rejected by reviewer' }),
    ).not.toThrow();
  });

  it('refuses budget spent decreasing or exceeding the commitment', () => {
    const less = { ...base, budget: { ...base.budget, currency_spent_usd: 0.5 } };
    expect(() => assertChangeAllowed(base, less, opts)).toThrow(
      /budget\.currency_spent_usd: never decreases \(was 1\)/,
    );
    const over = { ...base, budget: { ...base.budget, currency_spent_usd: 11 } };
    expect(() => assertChangeAllowed(base, over, opts)).toThrow(
      /must not exceed currency_committed_usd \(10\)/,
    );
  });
});

describe('audit replay', () => {
  it('rebuilds the document from RFC 6902 patches and refuses a gap', () => {
    const v2 = { ...base, version: 2, status: 'implementing' as const, active_agents: ['coder'] };
    const entries = [
      { version: 1, prev_version: null, patch: diff({}, base) },
      { version: 2, prev_version: 1, patch: diff(base, v2) },
    ];
    expect(replayAudit(entries)).toEqual(v2);
    expect(() => replayAudit([entries[1]!])).toThrow(/gap: expected version 1, found 2/);
  });
});
