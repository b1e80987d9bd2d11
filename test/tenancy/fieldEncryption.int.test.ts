import { mkdtempSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys, type TenantKeys } from '../../src/crypto/tenantKeys.js';
import { replayAudit } from '../../src/state/replay.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

/**
 * Classification covers every copy (issue 21): a confidential artifact is encrypted in the
 * live document and in the audit patches (so the plaintext never reaches Postgres), a secret
 * one is never stored, a copy in a reason or a message payload is refused; CAS, the SQL
 * guards and audit replay work as before; after crypto-shredding, nothing of the tenant's
 * confidential values can be found in any table file on disk.
 */
const CONF = 'CONFIDENTIAL-5d1e7b-plan';
const SECRET = 'SECRET-91ac02-token';
let t: TestDatabase;
let keys: TenantKeys;
let storeA: TaskStore;
let storeB: TaskStore;

beforeAll(async () => {
  t = await createTestDatabase('field_encryption');
  const path = join(mkdtempSync(join(tmpdir(), 'cairn-keys-')), 'keyring.json');
  writeKeyring(path);
  keys = createTenantKeys({ db: t.db, provider: localKeyring(path) });
  for (const tenant of ['fe-a', 'fe-b']) await keys.addTenant(tenant);
  const classification = {
    artifacts: 'confidential',
    'artifacts.test_results': 'secret',
    'artifacts.review_report': 'internal',
  } as const;
  for (const tenant of ['fe-a', 'fe-b']) {
    const store = createTaskStore({
      db: t.db,
      keys,
      classification,
      checkpointer: createCheckpointer({ db: t.db, keys }),
      cacheSize: 0,
    });
    if (tenant === 'fe-a') storeA = store;
    else storeB = store;
    await store.create({ task: newTask(`${tenant}-1`, { tenant_id: tenant }), actor: AGENT });
    const r = await store.update({
      taskId: `${tenant}-1`,
      expectedVersion: 1,
      patch: {
        status: 'implementing',
        gates: { plan_approved: true },
        artifacts: {
          implementation_plan: `s3://plans/${CONF}-${tenant}.md`,
          review_report: 's3://reports/r1',
        },
      },
      actor: AGENT,
    });
    if (!r.ok) throw r.error;
  }
});

afterAll(async () => {
  await t?.drop();
});

/** Every table file of the database on disk (heap, TOAST, indexes), after a CHECKPOINT flushed them. */
async function databaseFiles(): Promise<Buffer> {
  await sql`CHECKPOINT`.execute(t.db);
  const r = await sql<{ dir: string; oid: number }>`
    SELECT current_setting('data_directory') AS dir, oid FROM pg_database WHERE datname = current_database()`.execute(
    t.db,
  );
  const base = join(r.rows[0]!.dir, 'base', String(r.rows[0]!.oid));
  return Buffer.concat(
    readdirSync(base)
      .map((f) => join(base, f))
      .filter((f) => statSync(f).isFile())
      .map((f) => readFileSync(f)),
  );
}

describe('field classification in the task document and its audit log', () => {
  it('stores a confidential artifact only encrypted (document and audit), and reads it back in the clear', async () => {
    const raw = await sql<{ doc: string; audit: string }>`
      SELECT (SELECT doc::text FROM task_state WHERE task_id = 'fe-a-1') AS doc,
             (SELECT string_agg(patch::text, ' ') FROM task_audit WHERE task_id = 'fe-a-1') AS audit`.execute(
      t.db,
    );
    expect(raw.rows[0]!.doc).not.toContain(CONF);
    expect(raw.rows[0]!.audit).not.toContain(CONF);
    expect(raw.rows[0]!.doc).toContain('cairn:enc:v1:');
    expect(raw.rows[0]!.doc).toContain('s3://reports/r1'); // internal: in the clear
    const a = await storeA.get('fe-a-1');
    expect(a!.artifacts.implementation_plan).toBe(`s3://plans/${CONF}-fe-a.md`);

    // CAS, guards and replay work on the stored form; an unchanged artifact keeps its envelope.
    const r = await storeA.update({
      taskId: 'fe-a-1',
      expectedVersion: 2,
      patch: { status: 'reviewing', gates: { implementation_complete: true } },
      actor: AGENT,
    });
    expect(r.ok).toBe(true);
    const history = await storeA.history('fe-a-1');
    expect(JSON.stringify(history[2]!.patch)).not.toContain('implementation_plan');
    const stored = await t.db
      .selectFrom('task_state')
      .select('doc')
      .where('task_id', '=', 'fe-a-1')
      .executeTakeFirstOrThrow();
    expect(replayAudit(history)).toEqual(stored.doc);
    const stale = await storeA.update({ taskId: 'fe-a-1', expectedVersion: 2, patch: {}, actor: AGENT });
    expect(stale.ok).toBe(false);
  });

  it('refuses a secret artifact, and a confidential value copied into a reason or a message, writing nothing', async () => {
    await expect(
      storeA.update({
        taskId: 'fe-a-1',
        expectedVersion: 3,
        patch: { artifacts: { test_results: `vault://${SECRET}` } },
        actor: AGENT,
      }),
    ).rejects.toThrow(/artifacts.test_results: is classified secret and is never stored/);
    await expect(
      storeA.update({
        taskId: 'fe-a-1',
        expectedVersion: 3,
        patch: {},
        actor: AGENT,
        reason: `plan at s3://plans/${CONF}-fe-a.md approved`,
      }),
    ).rejects.toThrow(/reason of task fe-a-1: artifacts.implementation_plan: is confidential/);
    await expect(
      storeA.update({
        taskId: 'fe-a-1',
        expectedVersion: 3,
        patch: {},
        actor: AGENT,
        messages: [{ topic: 'fe.events', payload: { plan: `s3://plans/${CONF}-fe-a.md` } }],
      }),
    ).rejects.toThrow(/outbox message \[0\] of task fe-a-1: artifacts.implementation_plan/);
    const v = await t.db
      .selectFrom('task_state')
      .select('version')
      .where('task_id', '=', 'fe-a-1')
      .executeTakeFirstOrThrow();
    expect(v.version).toBe(3);
    const found = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM outbox WHERE position(${CONF}::bytea IN payload) > 0`.execute(t.db);
    expect(found.rows[0]!.n).toBe(0);
  });

  it("after crypto-shredding, no table file holds the tenant's confidential values; the other tenant is unharmed", async () => {
    expect(await keys.shred('fe-a')).toBe(1);
    const files = await databaseFiles();
    for (const tenant of ['fe-a', 'fe-b']) expect(files.includes(`${CONF}-${tenant}`)).toBe(false);
    expect(files.includes(SECRET)).toBe(false);
    await expect(storeA.get('fe-a-1')).rejects.toThrow(/data key .* does not exist \(shredded/);
    const b = await storeB.get('fe-b-1');
    expect(b!.artifacts.implementation_plan).toBe(`s3://plans/${CONF}-fe-b.md`);
    const history = await storeB.history('fe-b-1');
    const stored = await t.db
      .selectFrom('task_state')
      .select('doc')
      .where('task_id', '=', 'fe-b-1')
      .executeTakeFirstOrThrow();
    expect(replayAudit(history)).toEqual(stored.doc);
  });
});
