import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { DEFAULT_CLASSIFICATION } from '../../src/checkpoints/classification.js';
import { localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys, type TenantKeys } from '../../src/crypto/tenantKeys.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { placeHold, releaseHold } from '../../src/retention/holds.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const MARKER = 'MARKER-7f3a9c-plaintext';
let t: TestDatabase;
let dir: string;
let keyringPath: string;
let keys: TenantKeys;

/** Every byte of a table's files on disk (heap and TOAST), after a CHECKPOINT flushed them. */
async function rawTableBytes(table: string): Promise<Buffer> {
  await sql`CHECKPOINT`.execute(t.db);
  const r = await sql<{ dir: string; heap: string; toast: string | null }>`
    SELECT current_setting('data_directory') AS dir, pg_relation_filepath(c.oid) AS heap,
           pg_relation_filepath(c.reltoastrelid) AS toast
      FROM pg_class c WHERE c.relname = ${table}`.execute(t.db);
  const { dir: data, heap, toast } = r.rows[0]!;
  return Buffer.concat([heap, toast].filter(Boolean).map((p) => readFileSync(join(data, p!))));
}

async function createWithArtifacts(
  taskId: string,
  tenant: string,
  checkpointer = createCheckpointer({ db: t.db, keys }),
) {
  const store = createTaskStore({ db: t.db, checkpointer });
  await store.create({ task: newTask(taskId, { tenant_id: tenant }), actor: AGENT });
  const r = await store.update({
    taskId,
    expectedVersion: 1,
    patch: {
      status: 'implementing',
      gates: { plan_approved: true },
      artifacts: { implementation_plan: `s3://plans/${MARKER}.md`, review_report: `s3://secret/${MARKER}` },
    },
    actor: AGENT,
  });
  if (!r.ok) throw r.error;
  return store;
}

beforeAll(async () => {
  t = await createTestDatabase('encryption');
  dir = mkdtempSync(join(tmpdir(), 'cairn-keys-'));
  keyringPath = join(dir, 'keyring.json');
  writeKeyring(keyringPath);
  keys = createTenantKeys({ db: t.db, provider: localKeyring(keyringPath) });
  await keys.addTenant('enc-a');
  await keys.addTenant('enc-b');
});

afterAll(async () => {
  await t?.drop();
});

describe('encryption at rest (AES-256-GCM, per-tenant data keys)', () => {
  it('snapshots and receipt results hold no plaintext, on disk either; digests still verify', async () => {
    await createWithArtifacts('enc-1', 'enc-a');
    const receipts = createReceiptStore({ db: t.db, keys });
    const r = await receipts.runOnce({
      taskId: 'enc-1',
      step: 'note',
      tool: 'notes',
      args: { n: 1 },
      onUncertain: 'gate',
      effect: async () => ({ note: MARKER }),
    });
    expect(r.status).toBe('succeeded');

    const marker = Buffer.from(MARKER);
    const inSql = await sql<{ n: number }>`
      SELECT (SELECT count(*) FROM checkpoint_snapshot WHERE position(${marker}::bytea IN bytes) > 0)
           + (SELECT count(*) FROM tool_receipt WHERE result::text LIKE ${`%${MARKER}%`}
                                               OR position(${marker}::bytea IN result_enc) > 0) AS n`.execute(
      t.db,
    );
    expect(Number(inSql.rows[0]!.n)).toBe(0);
    for (const table of ['checkpoint_snapshot', 'tool_receipt']) {
      expect((await rawTableBytes(table)).includes(marker), table).toBe(false);
    }
    // The key id sits beside every ciphertext.
    const rows = await t.db
      .selectFrom('checkpoint_snapshot')
      .select(['key_id'])
      .where('task_id', '=', 'enc-1')
      .execute();
    expect(rows.length).toBe(2);
    expect(rows.every((x) => x.key_id?.startsWith('dk-'))).toBe(true);

    const checkpointer = createCheckpointer({ db: t.db, keys });
    const list = await checkpointer.list('enc-1');
    for (let i = 0; i < list.length; i++)
      expect((await checkpointer.verify(list[i]!, list[i + 1])).ok).toBe(true);
    expect((await receipts.byTask('enc-1'))[0]!.result).toEqual({ note: MARKER });
  });

  it("another tenant's key, or another task's ciphertext, is refused with a clear error and returns nothing", async () => {
    const row = await t.db
      .selectFrom('checkpoint_snapshot')
      .select(['bytes', 'key_id'])
      .where('task_id', '=', 'enc-1')
      .executeTakeFirstOrThrow();
    await expect(keys.open('enc-b', row.key_id!, row.bytes, 'snapshot:enc-1')).rejects.toThrow(
      /belongs to tenant enc-a, not enc-b: refusing to decrypt; nothing was returned/,
    );
    await expect(keys.open('enc-a', row.key_id!, row.bytes, 'snapshot:enc-2')).rejects.toThrow(
      /authentication failed/,
    );
  });

  it('classification: secret fields are never stored; the class is recorded; confidential without keys is refused', async () => {
    const checkpointer = createCheckpointer({
      db: t.db,
      keys,
      classification: {
        ...DEFAULT_CLASSIFICATION,
        'artifacts.review_report': 'secret',
      },
    });
    await createWithArtifacts('enc-2', 'enc-a', checkpointer);
    const cps = await checkpointer.list('enc-2');
    const v = await checkpointer.verify(cps[0]!, cps[1]);
    expect(v.ok).toBe(true);
    if (v.ok) {
      expect(v.state.artifacts.implementation_plan).toContain(MARKER);
      expect(v.state.artifacts.review_report).toBeUndefined();
    }
    const classes = await t.db
      .selectFrom('checkpoint')
      .select(['data_class', 'state_version'])
      .where('task_id', '=', 'enc-2')
      .orderBy('seq')
      .execute();
    expect(classes.map((c) => c.data_class)).toEqual(['internal', 'confidential']);

    const plain = createCheckpointer({ db: t.db, classification: DEFAULT_CLASSIFICATION });
    await expect(createWithArtifacts('enc-3', 'enc-a', plain)).rejects.toThrow(
      /confidential.*no tenant keys/,
    );
    // The task was created (nothing confidential yet); the refused change left it as it was.
    expect((await createTaskStore({ db: t.db }).get('enc-3'))?.version).toBe(1);
    expect(() => createCheckpointer({ db: t.db, classification: { status: 'secret' } })).toThrow(
      /status: is a required TaskState field/,
    );
  });

  it('KEK rotation rewraps data keys without touching payloads; old checkpoints still verify', async () => {
    const digestOf = async () =>
      createHash('sha256')
        .update(
          Buffer.concat(
            (
              await t.db.selectFrom('checkpoint_snapshot').select('bytes').orderBy('snapshot_id').execute()
            ).map((r) => r.bytes),
          ),
        )
        .digest('hex');
    const before = await digestOf();
    const newKek = writeKeyring(keyringPath, { rotate: true });
    const rotated = createTenantKeys({ db: t.db, provider: localKeyring(keyringPath) });
    const r = await rotated.rewrapAll();
    expect(r).toEqual({ rewrapped: 2, kekId: newKek });
    expect(await digestOf()).toBe(before);
    const checkpointer = createCheckpointer({ db: t.db, keys: rotated });
    const list = await checkpointer.list('enc-1');
    expect((await checkpointer.verify(list[0]!, list[1])).ok).toBe(true);
  });

  it('crypto-shredding is refused while a legal hold names the tenant or one of its tasks', async () => {
    for (const h of [{ tenantId: 'enc-a' }, { taskId: 'enc-1' }]) {
      const hold = await placeHold(t.db, { ...h, reason: 'litigation 2026-417', actor: 'dpo' });
      await expect(keys.shred('enc-a')).rejects.toThrow(
        /tenant enc-a is under legal hold: its data keys stay/,
      );
      expect(await releaseHold(t.db, { ...h, actor: 'dpo' })).toBe(1);
      expect(hold.created).toBe(true);
    }
    // Every key is still there: the next test shreds it.
  });

  it('crypto-shredding: without the data key the old ciphertext can never be read', async () => {
    expect(await keys.shred('enc-a')).toBe(1);
    const checkpointer = createCheckpointer({ db: t.db, keys });
    const list = await checkpointer.list('enc-1');
    const v = await checkpointer.verify(list[0]!, list[1]);
    expect(v.ok).toBe(false);
    if (!v.ok) expect(v.message).toMatch(/data key dk-.* of tenant enc-a does not exist/);
    await expect(createReceiptStore({ db: t.db, keys }).byTask('enc-1')).rejects.toThrow(/does not exist/);
  });

  it('bad input: unknown tenant, missing key file, malformed key file: clear errors, nothing written', async () => {
    const store = createTaskStore({ db: t.db, checkpointer: createCheckpointer({ db: t.db, keys }) });
    await expect(
      store.create({ task: newTask('enc-x', { tenant_id: 'nobody' }), actor: AGENT }),
    ).rejects.toThrow(/unknown tenant nobody: register it first/);
    expect(await store.get('enc-x')).toBeUndefined();
    await expect(
      store.create({ task: newTask('enc-y', { tenant_id: 'enc-a' }), actor: AGENT }),
    ).rejects.toThrow(/tenant enc-a has no data key/);
    expect(() => localKeyring(join(dir, 'absent.json'))).toThrow(
      /absent.json cannot be read \(ENOENT\).*cairn keys init/,
    );
    const bad = join(dir, 'bad.json');
    writeFileSync(bad, '{"version":1,"current":"k1","keys":{"k1":"c2hvcnQ="}}', { mode: 0o600 });
    expect(() => localKeyring(bad)).toThrow(/keys.k1: must be 32 bytes, base64/);
    expect(() => localKeyring(bad)).not.toThrow(/c2hvcnQ/); // key material is never echoed
    writeFileSync(bad, '{not json');
    expect(() => localKeyring(bad)).toThrow(/bad.json.*is not JSON/);
    writeFileSync(bad, `{"version":1,"current":"k2","keys":{"k1":"${Buffer.alloc(32).toString('base64')}"}}`);
    expect(() => localKeyring(bad)).toThrow(/current: names a key that is not in keys/);
  });
});
