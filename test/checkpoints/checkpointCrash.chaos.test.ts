import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { canonicalBytes, sha256 } from '../../src/canonical.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { resume, workflowDigestOf } from '../../src/recovery/resume.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { spawnTs } from '../support/processes.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let tdb: TestDatabase;
beforeAll(async () => {
  tdb = await createTestDatabase('checkpoint_crash', { max: 4 });
});
afterAll(async () => {
  await tdb.drop();
});

async function counts(taskId: string) {
  const one = async (q: ReturnType<typeof sql<{ n: number }>>) => (await q.execute(tdb.db)).rows[0]!.n;
  return {
    version: (await createTaskStore({ db: tdb.db }).get(taskId))!.version,
    checkpoints: await one(
      sql<{ n: number }>`SELECT count(*)::int AS n FROM checkpoint WHERE task_id = ${taskId}`,
    ),
    snapshots: await one(
      sql<{ n: number }>`SELECT count(*)::int AS n FROM checkpoint_snapshot WHERE task_id = ${taskId}`,
    ),
    audit: await one(sql<{ n: number }>`SELECT count(*)::int AS n FROM task_audit WHERE task_id = ${taskId}`),
  };
}

describe('checkpoints under worker death (real processes)', () => {
  it('a process SIGKILLed in the middle of taking a checkpoint leaves no checkpoint and no state change (both or neither), 5 times', async () => {
    const store = createTaskStore({ db: tdb.db, checkpointer: createCheckpointer({ db: tdb.db }) });
    await store.create({ task: newTask('partial'), actor: AGENT });
    const before = await counts('partial');
    expect(before).toEqual({ version: 1, checkpoints: 1, snapshots: 1, audit: 1 });
    for (const gate of [
      'plan_approved',
      'implementation_complete',
      'review_passed',
      'tests_passing',
      'security_approved',
    ]) {
      const child = spawnTs('checkpoint-worker', 'test/support/checkpointWorker.ts', {
        DATABASE_URL: tdb.url,
        TASK: 'partial',
        GATE: gate,
      });
      await child.exited;
      expect(child.proc.signalCode, child.output()).toBe('SIGKILL');
      expect(await counts('partial')).toEqual(before);
    }
    // The same change, when the process survives, writes both.
    const r = await store.update({
      taskId: 'partial',
      expectedVersion: 1,
      patch: { gates: { plan_approved: true } },
      actor: AGENT,
    });
    expect(r.ok).toBe(true);
    expect(await counts('partial')).toEqual({ version: 2, checkpoints: 2, snapshots: 2, audit: 2 });
  });

  it('v1 checkpoints written by an older Cairn (raw SQL fixtures) resume correctly', async () => {
    const workflow = { name: 'legacy-flow' };
    const store = createTaskStore({ db: tdb.db });
    const state = await store.create({
      task: newTask('legacy-cp', {
        workflow_digest: workflowDigestOf(workflow),
        budget: { currency_committed_usd: 50, currency_spent_usd: 12.5, tokens_spent: 900, hops_used: 3 },
      }),
      actor: AGENT,
    });
    const bytes = canonicalBytes(state);
    const snapshotId = '00000000-0000-4000-8000-000000000001';
    await sql`INSERT INTO checkpoint_snapshot (snapshot_id, task_id, bytes) VALUES (${snapshotId}::uuid, 'legacy-cp', ${bytes})`.execute(
      tdb.db,
    );
    const v1 = {
      schema_version: 'oaies.checkpoint.v1',
      checkpoint_id: '00000000-0000-4000-8000-000000000002',
      task_id: 'legacy-cp',
      state_version: 1,
      created_at: '2025-01-01T00:00:00.000Z',
      created_by: 'spiffe://acme.example/legacy',
      workflow_definition_digest: workflowDigestOf(workflow),
      state_snapshot_uri: `pg:checkpoint_snapshot/${snapshotId}`,
      snapshot_digest: sha256(bytes),
      tool_receipt_ids: [],
    };
    await sql`INSERT INTO checkpoint (checkpoint_id, task_id, seq, state_version, schema_version, reason, doc, digest)
              VALUES (${v1.checkpoint_id}::uuid, 'legacy-cp', 1, 1, 'oaies.checkpoint.v1', 'legacy', ${JSON.stringify(v1)}::jsonb,
                      ${sha256(canonicalBytes(v1))})`.execute(tdb.db);

    const checkpoints = createCheckpointer({ db: tdb.db });
    const [stored] = await checkpoints.list('legacy-cp');
    expect(stored!.checkpoint).toMatchObject({
      schema_version: 'oaies.checkpoint.v2',
      budget_consumed: { currency_usd: 12.5, tokens: 900, hops: 3 },
      input_digest: null,
      pending_work: [],
      provenance: { last_message_id: null, delegation_hash: null, policy_version: null },
    });
    const plan = await resume('legacy-cp', {
      db: tdb.db,
      store,
      checkpoints,
      receipts: createReceiptStore({ db: tdb.db }),
      leases: createLeaseManager({ db: tdb.db }),
      workflowDefinition: workflow,
      policy: async () => ({ version: 'p1', allowed: true, budgetLimitUsd: 500 }),
      actor: 'spiffe://acme.example/cairn/recovery',
      agentId: 'resumer',
    });
    expect(plan).toMatchObject({ outcome: 'resumed', checkpointId: v1.checkpoint_id, skipped: [] });
    expect(plan.state.version).toBe(1);
  });
});
