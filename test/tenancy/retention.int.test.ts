import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { insertInboxRows } from '../../consumers/sql/insertInboxRows.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys, type TenantKeys } from '../../src/crypto/tenantKeys.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { annotate, placeHold, releaseHold } from '../../src/retention/holds.js';
import {
  certificateIntact,
  runRetention,
  runRetentionWithTestHooks,
  setRetentionPolicy,
} from '../../src/retention/retention.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
let keys: TenantKeys;
let store: TaskStore;
const OPERATOR = 'spiffe://acme.example/operators/dpo';
const TABLES = [
  'task_state',
  'task_audit',
  'checkpoint',
  'checkpoint_snapshot',
  'tool_receipt',
  'task_lease',
  'task_annotation',
] as const;

/** Rows per table that belong to `taskId` (outbox and inbox by message key). */
async function footprint(taskId: string): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const table of TABLES) {
    const r = await sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM ${sql.table(table)} WHERE task_id = ${taskId}`.execute(t.db);
    out[table] = r.rows[0]!.n;
  }
  for (const table of ['outbox', 'inbox', 'inbox_key_version']) {
    const r = await sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM ${sql.table(table)} WHERE key = ${taskId}`.execute(t.db);
    out[table] = r.rows[0]!.n;
  }
  return out;
}
const everything = async () => {
  const ids = (await t.db.selectFrom('task_state').select('task_id').orderBy('task_id').execute()).map(
    (r) => r.task_id,
  );
  return Object.fromEntries(await Promise.all(ids.map(async (id) => [id, await footprint(id)] as const)));
};

/** A task of `tenant` that ends `cancelled`, with a receipt, a lease, a message, an inbox row (and its key's applied version) and an annotation. */
async function finishedTask(taskId: string, tenant: string, o: { artifacts?: boolean; end?: boolean } = {}) {
  await store.create({ task: newTask(taskId, { tenant_id: tenant }), actor: AGENT });
  const r = await store.update({
    taskId,
    expectedVersion: 1,
    patch: {
      status: 'implementing',
      gates: { plan_approved: true },
      ...(o.artifacts ? { artifacts: { implementation_plan: `s3://plans/${taskId}.md` } } : {}),
    },
    actor: AGENT,
    messages: [{ topic: 'retention.events', payload: { taskId } }],
  });
  if (!r.ok) throw r.error;
  await createReceiptStore({ db: t.db, keys }).runOnce({
    taskId,
    step: 'work',
    tool: 'tool',
    args: { taskId },
    onUncertain: 'gate',
    effect: async () => ({ done: taskId }),
  });
  const leases = createLeaseManager({ db: t.db });
  const lease = await leases.acquire({ taskId, branch: 'main', agentId: 'w1', ttlMs: 30_000 });
  if (lease.ok) await leases.release(lease);
  await t.db.transaction().execute((trx) =>
    insertInboxRows(trx, 'g1', [
      {
        messageId: `in-${taskId}`,
        topic: 'x',
        partition: 0,
        offset: '1',
        key: taskId,
        tenantId: tenant,
      },
    ]),
  );
  // A consumer with refuseStaleVersions applied version 2 of the task's key. Left behind
  // (review), it refused every message of a task created again under the id after retention.
  await sql`INSERT INTO inbox_key_version (consumer_group, tenant_id, key, version, seq)
            VALUES ('g1', ${tenant}, ${taskId}, 2, 0)`.execute(t.db);
  await annotate(t.db, { taskId, author: OPERATOR, body: 'checked' });
  if (o.end !== false) {
    const e = await store.update({
      taskId,
      expectedVersion: 2,
      patch: { status: 'cancelled' },
      actor: AGENT,
    });
    if (!e.ok) throw e.error;
  }
}

beforeAll(async () => {
  t = await createTestDatabase('retention');
  const path = join(mkdtempSync(join(tmpdir(), 'cairn-keys-')), 'keyring.json');
  writeKeyring(path);
  keys = createTenantKeys({ db: t.db, provider: localKeyring(path) });
  for (const tenant of ['ret-a', 'ret-b']) await keys.addTenant(tenant);
  store = createTaskStore({ db: t.db, checkpointer: createCheckpointer({ db: t.db, keys }) });
  await finishedTask('old-1', 'ret-a');
  await finishedTask('old-2', 'ret-a');
  await finishedTask('conf-1', 'ret-a', { artifacts: true }); // confidential: kept 30 days
  await finishedTask('held-1', 'ret-a');
  await finishedTask('open-1', 'ret-a', { end: false }); // not finished: never expires
  await finishedTask('b-1', 'ret-b'); // ret-b has no policy: kept
  await finishedTask('unpub-1', 'ret-a'); // finished, but its message never reached the broker
  // The relay published every other task's messages (it deletes what the broker acked).
  await t.db.deleteFrom('outbox').where('key', '<>', 'unpub-1').execute();
  await setRetentionPolicy(t.db, { tenantId: 'ret-a', dataClass: 'internal', retainDays: 0 });
  await setRetentionPolicy(t.db, { tenantId: 'ret-a', dataClass: 'confidential', retainDays: 30 });
  await placeHold(t.db, { taskId: 'held-1', reason: 'litigation 2026-117', actor: OPERATOR });
});

afterAll(async () => {
  await t?.drop();
});

describe('retention, deletion certificates and legal hold', () => {
  it('a failing batch rolls back whole: nothing half-deleted, no certificate; the run says which tenant failed', async () => {
    const before = await everything();
    const run = await runRetentionWithTestHooks(
      { db: t.db, actor: OPERATOR },
      {
        afterDeletes: () => {
          throw new Error('disk full');
        },
      },
    );
    expect(run.failed).toEqual([{ tenantId: expect.any(String), error: 'disk full' }]);
    expect(run.certificates).toEqual([]);
    expect(await everything()).toEqual(before);
    expect(await t.db.selectFrom('deletion_certificate').selectAll().execute()).toEqual([]);
  });

  it('removes exactly the expired data across every table, leaves the rest, and the certificate matches', async () => {
    const before = await everything();
    expect(before['old-1']).toMatchObject({
      task_audit: 3,
      checkpoint: 3,
      tool_receipt: 1,
      outbox: 0,
      inbox: 1,
      inbox_key_version: 1,
      task_annotation: 1,
    });
    const dry = await runRetention({ db: t.db, actor: OPERATOR, dryRun: true });
    expect(dry.tasks.sort()).toEqual(['old-1', 'old-2']);
    expect(await everything()).toEqual(before);

    const run = await runRetention({ db: t.db, actor: OPERATOR, batchSize: 1 });
    expect(run.tasks.sort()).toEqual(['old-1', 'old-2']);
    expect(run.held).toEqual(['held-1']);
    // Never delete a message that has not reached the broker: the task waits for the relay.
    expect(run.deferred).toEqual(['unpub-1']);
    expect(run.certificates).toHaveLength(2); // one per batch, each committed with its deletes
    const after = await everything();
    expect(Object.keys(after).sort()).toEqual(['b-1', 'conf-1', 'held-1', 'open-1', 'unpub-1']);
    expect(after['unpub-1']).toMatchObject({ task_state: 1, outbox: 1 });
    for (const id of Object.keys(after)) expect(after[id]).toEqual(before[id]);
    for (const id of ['old-1', 'old-2'])
      expect(Object.values(await footprint(id)).every((n) => n === 0)).toBe(true);

    // The stored certificates: intact, and saying exactly what was there before.
    const stored = await t.db
      .selectFrom('deletion_certificate')
      .selectAll()
      .where('run_id', '=', run.runId)
      .execute();
    expect(stored).toHaveLength(2);
    for (const c of stored) {
      expect(certificateIntact(c)).toBe(true);
      const task = (c.body.tasks as Array<Record<string, unknown>>)[0]!;
      const was = before[task.task_id as string]!;
      expect(task).toMatchObject({
        audit_rows: was.task_audit,
        snapshots: was.checkpoint_snapshot,
        receipts: was.tool_receipt,
        outbox: was.outbox,
        inbox: was.inbox,
        leases: was.task_lease,
        annotations: was.task_annotation,
        data_class: 'internal',
      });
      expect((task.checkpoint_digests as string[]).length).toBe(was.checkpoint);
      expect(c.body.totals).toMatchObject({
        tasks: 1,
        audit_rows: was.task_audit,
        checkpoints: was.checkpoint,
      });
    }
    await expect(sql`UPDATE deletion_certificate SET digest = 'x'`.execute(t.db)).rejects.toThrow(
      /immutable/,
    );
  });

  it('held data is never deleted, even by hand, yet takes correction annotations; released, it goes', async () => {
    await expect(
      t.db.transaction().execute(async (trx) => {
        await sql`SET LOCAL cairn.retention = 'on'`.execute(trx);
        await sql`DELETE FROM task_audit WHERE task_id = 'held-1'`.execute(trx);
      }),
    ).rejects.toThrow(/held-1 of tenant ret-a is under legal hold/);
    await annotate(t.db, {
      taskId: 'held-1',
      author: OPERATOR,
      body: 'correction: the reviewer was bob, not alice',
    });
    expect((await footprint('held-1')).task_annotation).toBe(2);
    await expect(sql`DELETE FROM task_annotation WHERE task_id = 'held-1'`.execute(t.db)).rejects.toThrow();

    // A tenant-wide hold covers everything of that tenant.
    await placeHold(t.db, { tenantId: 'ret-a', reason: 'regulator request', actor: OPERATOR });
    expect(await releaseHold(t.db, { taskId: 'held-1', actor: OPERATOR })).toBe(1);
    expect((await runRetention({ db: t.db, actor: OPERATOR })).tasks).toEqual([]);
    expect(await releaseHold(t.db, { tenantId: 'ret-a', actor: OPERATOR })).toBe(1);
    const run = await runRetention({ db: t.db, actor: OPERATOR });
    expect(run.tasks).toEqual(['held-1']);
    expect(Object.values(await footprint('held-1')).every((n) => n === 0)).toBe(true);
  });

  it('bad input: unknown tenant, bad class or days, a hold without reason: clear errors, nothing changed', async () => {
    const before = await everything();
    await expect(runRetention({ db: t.db, actor: OPERATOR, tenantId: 'nobody' })).rejects.toThrow(
      /unknown tenant nobody/,
    );
    await expect(
      setRetentionPolicy(t.db, { tenantId: 'nobody', dataClass: 'internal', retainDays: 1 }),
    ).rejects.toThrow(/unknown tenant nobody/);
    await expect(
      setRetentionPolicy(t.db, { tenantId: 'ret-a', dataClass: 'secret', retainDays: 1 }),
    ).rejects.toThrow(/class: must be one of public, internal, confidential \(got "secret"\)/);
    await expect(
      setRetentionPolicy(t.db, { tenantId: 'ret-a', dataClass: 'internal', retainDays: -1 }),
    ).rejects.toThrow(/days: must be a number of days >= 0 \(got -1\)/);
    await expect(placeHold(t.db, { taskId: 'b-1', reason: ' ', actor: OPERATOR })).rejects.toThrow(
      /reason: is required/,
    );
    await expect(placeHold(t.db, { taskId: 'ghost', reason: 'x', actor: OPERATOR })).rejects.toThrow(/ghost/);
    await expect(placeHold(t.db, { tenantId: 'nobody', reason: 'x', actor: OPERATOR })).rejects.toThrow(
      /unknown tenant nobody/,
    );
    expect(await everything()).toEqual(before);
  });
});
