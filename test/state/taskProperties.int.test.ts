import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CairnError } from '../../src/errors.js';
import { GATES, STATUSES, type TaskState } from '../../src/schemas/taskState.js';
import { replayAudit } from '../../src/state/replay.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { isTerminal } from '../../src/state/transitions.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { AGENT, newTask } from './fixtures.js';

let tdb: TestDatabase;
let store: TaskStore;
beforeAll(async () => {
  tdb = await createTestDatabase('task_props');
  store = createTaskStore({ db: tdb.db });
});
afterAll(async () => {
  await tdb.drop();
});

/** Patches drawn from valid and invalid shapes alike: bad statuses, unknown keys, overspend, stale versions. */
const patchArb = fc.oneof(
  fc.record({ status: fc.constantFrom(...STATUSES) }),
  fc.record({ gates: fc.dictionary(fc.constantFrom(...GATES), fc.boolean(), { maxKeys: 3 }) }),
  fc.record({ budget: fc.record({ currency_spent_usd: fc.integer({ min: 0, max: 150 }) }) }),
  fc.record({ budget: fc.record({ tokens_spent: fc.integer({ min: 0, max: 1000 }) }) }),
  fc.record({ active_agents: fc.array(fc.constantFrom('planner', 'coder', 'reviewer'), { maxLength: 3 }) }),
  fc.record({ artifacts: fc.record({ review_report: fc.webUrl() }) }),
  fc.constant({ not_a_field: 1 }),
  fc.record({ status: fc.constant('archived') }),
);
const opArb = fc.record({
  patch: patchArb,
  reason: fc.option(fc.constantFrom('operator decision', ''), { nil: undefined }),
  staleBy: fc.constantFrom(0, 0, 0, 1), // sometimes name an older version
});

describe('TaskState store invariants under random patch sequences', () => {
  it('any sequence of valid and invalid patches keeps versions contiguous, terminal states frozen and audit replay equal to state', async () => {
    let run = 0;
    await fc.assert(
      fc.asyncProperty(fc.array(opArb, { minLength: 1, maxLength: 12 }), async (ops) => {
        const taskId = `prop-${run++}`;
        let model: TaskState = await store.create({ task: newTask(taskId), actor: AGENT });
        for (const op of ops) {
          const expectedVersion = model.version - op.staleBy;
          const before = model;
          try {
            const r = await store.update({
              taskId,
              expectedVersion,
              patch: op.patch as never,
              actor: AGENT,
              ...(op.reason === undefined ? {} : { reason: op.reason }),
            });
            if (r.ok) {
              expect(op.staleBy).toBe(0);
              expect(isTerminal(before.status)).toBe(false);
              expect(r.state.version).toBe(before.version + 1);
              model = r.state;
            } else {
              expect(expectedVersion).not.toBe(before.version);
            }
          } catch (err) {
            // A refusal is a typed Cairn error, never a crash, and it changed nothing.
            expect(err).toBeInstanceOf(CairnError);
          }
          const stored = await store.get(taskId);
          expect(stored).toEqual(model);
        }
        const history = await store.history(taskId);
        expect(history.map((h) => h.version)).toEqual(Array.from({ length: model.version }, (_, i) => i + 1));
        expect(replayAudit(history)).toEqual(model);
      }),
      { numRuns: 40, seed: Number(process.env.FC_SEED ?? 20261129) },
    );
  });
});
