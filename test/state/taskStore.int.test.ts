import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { InvalidTransitionError, StaleWriteError, ValidationError } from '../../src/errors.js';
import { replayAudit } from '../../src/state/replay.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { TRANSITIONS } from '../../src/state/transitions.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { AGENT, newTask, planApproved } from './fixtures.js';

let tdb: TestDatabase;
let store: TaskStore;

beforeAll(async () => {
  tdb = await createTestDatabase('task_store');
  store = createTaskStore({ db: tdb.db });
});
afterAll(async () => {
  await tdb.drop();
});

async function auditCount(taskId: string): Promise<number> {
  const r = await tdb.db
    .selectFrom('task_audit')
    .select((eb) => eb.fn.countAll<string>().as('n'))
    .where('task_id', '=', taskId)
    .executeTakeFirstOrThrow();
  return Number(r.n);
}

describe('TaskState store on real Postgres', () => {
  it('creates, updates by CAS, and keeps one audit row per version that replays to the state', async () => {
    const created = await store.create({ task: newTask('basic'), actor: AGENT });
    expect(created).toMatchObject({ version: 1, status: 'planning', updated_by: AGENT });
    const r = await store.update({
      taskId: 'basic',
      expectedVersion: 1,
      patch: planApproved('s3://plans/1'),
      actor: AGENT,
      reason: 'plan approved',
    });
    expect(r.ok).toBe(true);
    const current = await store.get('basic');
    expect(current).toMatchObject({ version: 2, status: 'implementing', gates: { plan_approved: true } });
    const history = await store.history('basic');
    expect(history.map((h) => [h.version, h.prev_version])).toEqual([
      [1, null],
      [2, 1],
    ]);
    expect(history[1]).toMatchObject({ actor: AGENT, reason: 'plan approved' });
    expect(replayAudit(history)).toEqual(current);
  });

  it('a stale write returns StaleWriteError with expected and current version, and changes nothing', async () => {
    await store.create({ task: newTask('stale'), actor: AGENT });
    expect(
      (
        await store.update({
          taskId: 'stale',
          expectedVersion: 1,
          patch: { active_agents: ['a'] },
          actor: AGENT,
        })
      ).ok,
    ).toBe(true);
    const r = await store.update({
      taskId: 'stale',
      expectedVersion: 1,
      patch: { active_agents: ['b'] },
      actor: AGENT,
    });
    expect(r.ok).toBe(false);
    if (r.ok) return;
    expect(r).toMatchObject({ reason: 'stale_version', expectedVersion: 1, currentVersion: 2 });
    expect(r.error).toBeInstanceOf(StaleWriteError);
    expect(r.error.message).toContain('expected version 1 but the current version is 2');
    expect(await store.get('stale')).toMatchObject({ version: 2, active_agents: ['a'] });
    expect(await auditCount('stale')).toBe(2);
  });

  it('a terminal task never changes again, with the error text checked, and nothing is written', async () => {
    await store.create({ task: newTask('term'), actor: AGENT });
    await store.update({
      taskId: 'term',
      expectedVersion: 1,
      patch: { status: 'cancelled' },
      actor: AGENT,
      reason: 'user cancelled',
    });
    const attempt = store.update({
      taskId: 'term',
      expectedVersion: 2,
      patch: { active_agents: ['x'] },
      actor: AGENT,
    });
    await expect(attempt).rejects.toThrow(InvalidTransitionError);
    await expect(
      store.update({ taskId: 'term', expectedVersion: 2, patch: { status: 'planning' }, actor: AGENT }),
    ).rejects.toThrow('task term is cancelled (terminal) and can never change again');
    expect(await store.get('term')).toMatchObject({ version: 2, status: 'cancelled' });
    expect(await auditCount('term')).toBe(2);
  });

  it('refuses unknown keys in a patch and in a new task, naming the key', async () => {
    await store.create({ task: newTask('unknown'), actor: AGENT });
    await expect(
      store.update({
        taskId: 'unknown',
        expectedVersion: 1,
        patch: { colour: 'red' } as never,
        actor: AGENT,
      }),
    ).rejects.toThrow('invalid patch for task unknown: (root): unknown key(s) "colour" are not allowed');
    await expect(
      store.update({
        taskId: 'unknown',
        expectedVersion: 1,
        patch: { gates: { plan_aproved: true } } as never,
        actor: AGENT,
      }),
    ).rejects.toThrow('gates: unknown key(s) "plan_aproved" are not allowed');
    await expect(
      store.create({
        task: { ...newTask('unknown2'), reasoning: 'chain of thought' } as never,
        actor: AGENT,
      }),
    ).rejects.toThrow('unknown key(s) "reasoning" are not allowed');
    expect(await store.get('unknown2')).toBeUndefined();
    expect(await auditCount('unknown')).toBe(1);
  });

  it('refuses a value that looks like a credential, naming the field and never echoing it', async () => {
    await store.create({ task: newTask('secret'), actor: AGENT });
    const err = await store
      .update({
        taskId: 'secret',
        expectedVersion: 1,
        patch: { artifacts: { test_results: 'token ghp_abcdefghijklmnopqrstuvwxyz0123456789AB' } },
        actor: AGENT,
      })
      .catch((e: unknown) => e);
    expect((err as Error).message).toBe(
      'invalid task secret: artifacts.test_results: looks like a GitHub token; secrets are never stored in task state or checkpoints (store a reference to a secret manager instead)',
    );
    expect(await store.get('secret')).toMatchObject({ version: 1, artifacts: {} });
  });

  it('refuses a bad SPIFFE ID as actor, naming the value', async () => {
    await store.create({ task: newTask('spiffe'), actor: AGENT });
    const err = await store
      .update({ taskId: 'spiffe', expectedVersion: 1, patch: {}, actor: 'agent-7' })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ValidationError);
    expect((err as Error).message).toBe(
      'invalid actor: actor: must be a SPIFFE ID of the form spiffe://<trust-domain>/<path> (got "agent-7")',
    );
    await expect(store.create({ task: newTask('spiffe2'), actor: 'spiffe://ACME/x' })).rejects.toThrow(
      /SPIFFE ID/,
    );
  });

  it('enforces gates, completion and budget rules on write', async () => {
    await store.create({ task: newTask('rules'), actor: AGENT });
    let v = 1;
    const step = async (patch: object, reason?: string) => {
      const r = await store.update({
        taskId: 'rules',
        expectedVersion: v,
        patch,
        actor: AGENT,
        ...(reason ? { reason } : {}),
      });
      if (!r.ok) throw r.error;
      v = r.state.version;
    };
    await step({ status: 'implementing', gates: { plan_approved: true } });
    await expect(step({ gates: { plan_approved: false } })).rejects.toThrow(
      /gates\.plan_approved: .*explicit reason/,
    );
    await step({ gates: { plan_approved: false } }, 'reviewer found a flaw');
    await expect(step({ budget: { currency_spent_usd: 150 } })).rejects.toThrow(
      /budget\.currency_spent_usd: must not exceed currency_committed_usd \(100\)/,
    );
    await step({ budget: { currency_spent_usd: 40 } });
    await expect(step({ budget: { currency_spent_usd: 30 } })).rejects.toThrow(/never decreases \(was 40\)/);
    await step({ status: 'reviewing', gates: { implementation_complete: true } });
    await step({ status: 'testing', gates: { review_passed: true } });
    await expect(step({ status: 'complete', gates: { tests_passing: true } })).rejects.toThrow(
      /false: plan_approved/,
    );
    await step({ status: 'complete', gates: { tests_passing: true, plan_approved: true } });
    expect(await store.get('rules')).toMatchObject({ status: 'complete', version: v });
    expect(replayAudit(await store.history('rules'))).toEqual(await store.get('rules'));
  });

  // Review: a patch may clear a field with undefined. The store kept that key in its cached
  // document (Postgres stored the JSON without it), so the next update's audit patch replaced a
  // path the stored document did not have: the audit log no longer replayed to the task (and a
  // failover region applying the changelog held a healthy task).
  it('a field cleared with undefined, then set again: the audit log still replays to the task', async () => {
    await store.create({
      task: newTask('cleared', { artifacts: { review_report: undefined } as never }),
      actor: AGENT,
    });
    let v = 1;
    const step = async (patch: object) => {
      const r = await store.update({
        taskId: 'cleared',
        expectedVersion: v,
        actor: AGENT,
        patch: patch as never,
      });
      expect(r.ok).toBe(true);
      v++;
    };
    await step({ artifacts: { review_report: 's3://r/1' } });
    await step({ artifacts: { review_report: undefined } });
    await step({ artifacts: { review_report: 's3://r/2' } });
    const current = await store.get('cleared');
    expect(current?.artifacts).toEqual({ review_report: 's3://r/2' });
    expect(replayAudit(await store.history('cleared'))).toEqual(current);
    const { rows } = await sql<{
      doc: unknown;
    }>`SELECT doc FROM task_state WHERE task_id = 'cleared'`.execute(tdb.db);
    expect(rows[0]?.doc).toEqual(current);
  });

  // Review: get() inside a caller's transaction cached what that transaction read. Rolled back,
  // the copy let a later update's CAS (version and updated_at, milliseconds) pass against a row
  // another store wrote in the same millisecond: that store's change was lost.
  it("a read inside a transaction that rolls back is not kept: another store's change in the same millisecond survives", async () => {
    const at = new Date('2026-12-03T12:00:00.000Z');
    const s1 = createTaskStore({ db: tdb.db, clock: () => at });
    const s2 = createTaskStore({ db: tdb.db, clock: () => at });
    await s1.create({ task: newTask('rolled'), actor: AGENT });
    const art = (a: Record<string, string>) => ({ artifacts: a }) as never;
    await tdb.db
      .transaction()
      .execute(async (trx) => {
        await s1.update({
          taskId: 'rolled',
          expectedVersion: 1,
          actor: AGENT,
          patch: art({ implementation_plan: 's3://A' }),
          trx,
        });
        await s1.get('rolled', { trx });
        throw new Error('rolled back');
      })
      .catch(() => {});
    expect(
      (
        await s2.update({
          taskId: 'rolled',
          expectedVersion: 1,
          actor: AGENT,
          patch: art({ review_report: 's3://B' }),
        })
      ).ok,
    ).toBe(true);
    await s1.update({
      taskId: 'rolled',
      expectedVersion: 2,
      actor: AGENT,
      patch: art({ test_results: 's3://C' }),
    });
    const current = await createTaskStore({ db: tdb.db }).get('rolled');
    expect(current?.artifacts).toEqual({ review_report: 's3://B', test_results: 's3://C' });
    expect(replayAudit(await store.history('rolled'))).toEqual(current);
  });

  it('a reason that looks like a credential is refused naming it, and nothing is written', async () => {
    await store.create({ task: newTask('secret-reason'), actor: AGENT });
    const token = `ghp_${'a'.repeat(36)}`;
    const err = await store
      .update({
        taskId: 'secret-reason',
        expectedVersion: 1,
        actor: AGENT,
        patch: planApproved(),
        reason: `retry with ${token}`,
      })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ValidationError);
    expect(String((err as Error).message)).toMatch(/reason/);
    expect(String((err as Error).message)).not.toContain(token);
    expect((await store.get('secret-reason'))?.version).toBe(1);
    await expect(
      store.create({ task: newTask('secret-reason-2'), actor: AGENT, reason: `made with ${token}` }),
    ).rejects.toBeInstanceOf(ValidationError);
    // The checkpoint's own reason too (review of the fix): it is stored, signed, for good.
    const viaCheckpoint = await store
      .update({
        taskId: 'secret-reason',
        expectedVersion: 1,
        actor: AGENT,
        patch: planApproved(),
        checkpoint: { reason: `plan with ${token}` },
      } as never)
      .catch((e: unknown) => e);
    expect(viaCheckpoint).toBeInstanceOf(ValidationError);
    expect((await store.get('secret-reason'))?.version).toBe(1);
  });

  it('the SQL transition table is the same as the code table', async () => {
    const rows = await tdb.db
      .selectFrom('task_transition' as never)
      .selectAll()
      .execute();
    const fromSql = new Set(
      (rows as Array<{ from_status: string; to_status: string }>).map(
        (r) => `${r.from_status}>${r.to_status}`,
      ),
    );
    const fromCode = new Set(Object.entries(TRANSITIONS).flatMap(([f, tos]) => tos.map((t) => `${f}>${t}`)));
    expect(fromSql).toEqual(fromCode);
  });

  it('version rises by exactly 1 even for hand-written SQL (the trigger refuses a jump)', async () => {
    await store.create({ task: newTask('jump'), actor: AGENT });
    await expect(
      sql`UPDATE task_state SET version = 5 WHERE task_id = 'jump'`.execute(tdb.db),
    ).rejects.toThrow(/version must rise by exactly 1/);
  });
});
