/**
 * A tenant's data key that does not unwrap under the key provider's key-encryption key (region
 * B started with another keyring file under the same KEK ids) says nothing about the rows it
 * encrypted: it is `key_unavailable`, an outage (invariant 13), for the task store, checkpoints
 * (resume, verify, `cairn checkpoint verify` exits 75) and the LangGraph saver, which records
 * nothing. Only a payload that fails its own authentication is corruption.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { RunnableConfig } from '@langchain/core/runnables';
import { emptyCheckpoint, uuid6 } from '@langchain/langgraph-checkpoint';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { CairnSaver } from '../../langgraph/index.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys } from '../../src/crypto/tenantKeys.js';
import type { Db } from '../../src/db/database.js';
import { UnavailableError } from '../../src/errors.js';
import { resume } from '../../src/recovery/resume.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { resumeOptions, seedPlannedTask } from '../checkpoints/fixtures.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { cairnBundle } from '../support/cli.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase } from '../support/testDatabase.js';

const exec = promisify(execFile);
let t: TestDatabase;
let app: Db;
let asA: Db;
/** Region A's keyring, and region B's: the same KEK ids, other key bytes. */
let keyringA: string;
let keyringB: string;

beforeAll(async () => {
  t = await createTestDatabase('key_unwrap');
  ({ app, asA } = await twoTenants(t));
  const dir = mkdtempSync(join(tmpdir(), 'cairn-unwrap-'));
  keyringA = join(dir, 'a.json');
  writeKeyring(keyringA);
  const data = JSON.parse(readFileSync(keyringA, 'utf8')) as { keys: Record<string, string> };
  for (const id of Object.keys(data.keys)) data.keys[id] = randomBytes(32).toString('base64');
  keyringB = join(dir, 'b.json');
  writeFileSync(keyringB, JSON.stringify(data), { mode: 0o600 });
  await createTenantKeys({ db: t.db, provider: localKeyring(keyringA) }).addTenant('tenant-a');
});
afterAll(async () => {
  await app?.destroy();
  await t?.drop();
});

const keysOf = (path: string) => createTenantKeys({ db: t.db, provider: localKeyring(path) });
const unavailable = { code: 'key_unavailable', retriable: true };

describe('a data key that does not unwrap is key_unavailable, an outage', () => {
  it('TenantKeys: key_unavailable naming tenant, key and KEK; a payload that fails authentication is still decryption_failed', async () => {
    const sealed = await keysOf(keyringA).seal('tenant-a', Buffer.from('plan'), 'aad');
    const err = await keysOf(keyringB)
      .open('tenant-a', sealed.keyId, sealed.bytes, 'aad')
      .catch((e: unknown) => e);
    expect(err).toMatchObject(unavailable);
    expect((err as Error).message).toContain(`tenant-a/${sealed.keyId}`);
    expect((err as Error).message).toMatch(/key-encryption key kek-/);
    await expect(keysOf(keyringB).seal('tenant-a', Buffer.from('plan'), 'aad')).rejects.toMatchObject(
      unavailable,
    );

    const altered = Buffer.from(sealed.bytes);
    altered[altered.length - 1]! ^= 1;
    await expect(keysOf(keyringA).open('tenant-a', sealed.keyId, altered, 'aad')).rejects.toMatchObject({
      code: 'decryption_failed',
    });
  });

  it('TaskStore: reading a task with an encrypted artifact throws key_unavailable', async () => {
    await createTaskStore({ db: t.db, keys: keysOf(keyringA) }).create({
      task: {
        ...newTask('T-store', { tenant_id: 'tenant-a' }),
        artifacts: { implementation_plan: 's3://plan' },
      },
      actor: AGENT,
    });
    await expect(
      createTaskStore({ db: t.db, keys: keysOf(keyringB), cacheSize: 0 }).get('T-store'),
    ).rejects.toMatchObject(unavailable);
  });

  it('checkpoints: verify says unavailable, resume stops with UnavailableError and the task is unchanged; `cairn checkpoint verify` exits 75', async () => {
    const writer = createCheckpointer({ db: t.db, keys: keysOf(keyringA) });
    await seedPlannedTask(createTaskStore({ db: t.db, checkpointer: writer }), 'T-cp', 'tenant-a');
    const checkpoints = createCheckpointer({ db: t.db, keys: keysOf(keyringB) });
    const store = createTaskStore({ db: t.db, checkpointer: checkpoints });
    const [newest, previous] = await checkpoints.list('T-cp');
    expect(await checkpoints.verify(newest!, previous)).toMatchObject({ ok: false, reason: 'unavailable' });

    const before = await store.history('T-cp');
    const err = await resume('T-cp', resumeOptions({ db: t.db, store, checkpoints })).catch(
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(UnavailableError);
    expect((await store.get('T-cp'))!.status).toBe('implementing');
    expect(await store.history('T-cp')).toEqual(before);

    const r = await exec(process.execPath, [cairnBundle(), 'checkpoint', 'verify', 'T-cp'], {
      cwd: repoRoot,
      env: {
        ...process.env,
        DATABASE_URL: t.url,
        KAFKA_BROKERS: kafkaBrokers().join(','),
        CAIRN_KEYRING: keyringB,
      },
    }).then(
      (o) => ({ code: 0, out: o.stdout }),
      (e: { code: number; stdout: string }) => ({ code: e.code, out: e.stdout }),
    );
    expect(r.out).toMatch(/UNAVAILABLE/);
    expect(r.out).not.toMatch(/CORRUPT/);
    expect(r.code).toBe(75);
  });

  it('CairnSaver: getTuple throws key_unavailable and records nothing; region A continues the thread', async () => {
    const writer = new CairnSaver({ db: asA, keys: keysOf(keyringA) });
    let config: RunnableConfig = { configurable: { thread_id: 'unwrap-1', checkpoint_ns: '' } };
    for (let i = 1; i <= 2; i++) {
      const cp = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: { notes: `step ${i}` } };
      cp.channel_versions = { notes: i };
      config = await writer.put(config, cp, { source: 'loop', step: i, parents: {} }, cp.channel_versions);
    }
    const regionB = new CairnSaver({ db: asA, keys: keysOf(keyringB) });
    await expect(regionB.getTuple({ configurable: { thread_id: 'unwrap-1' } })).rejects.toMatchObject(
      unavailable,
    );
    await expect(regionB.getTuple(config)).rejects.toMatchObject(unavailable);
    const { rows } = await sql`SELECT * FROM lg_event WHERE thread_id = 'unwrap-1'`.execute(t.db);
    expect(rows).toEqual([]);

    const cp = { ...emptyCheckpoint(), id: uuid6(-1), channel_values: { notes: 'step 3' } };
    cp.channel_versions = { notes: 3 };
    const next = await writer.put(config, cp, { source: 'loop', step: 3, parents: {} }, cp.channel_versions);
    expect((await writer.getTuple({ configurable: { thread_id: 'unwrap-1' } }))?.config).toEqual(next);
  });
});
