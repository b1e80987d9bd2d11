import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll } from 'vitest';
import { localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys, type Sealed } from '../../src/crypto/tenantKeys.js';
import { placeHold } from '../../src/retention/holds.js';
import { certificateIntact, setRetentionPolicy } from '../../src/retention/retention.js';

import {
  type Case,
  keyring,
  OPERATOR,
  type Run,
  rewrapDatabase,
  row,
  runCases,
  setUp,
  suffix,
  t,
  task,
  tearDown,
  tenant,
} from './operatorRepeatsHarness.js';

const cases: Array<Case<unknown>> = [
  row<{ tenant: string }>({
    command: 'tenant add',
    async setup() {
      const id = `rep-${suffix()}`;
      return { args: ['tenant', 'add', id], scope: { tenant: id } };
    },
    async fingerprint({ tenant: id }) {
      const tenants = await t.db
        .selectFrom('tenant')
        .select('tenant_id')
        .where('tenant_id', '=', id)
        .execute();
      const keys = await t.db.selectFrom('tenant_key').select('kek_id').where('tenant_id', '=', id).execute();
      return { tenants: tenants.length, keys };
    },
    first: { code: 0, out: /: registered, data key dk-/ },
    second: { code: 0, out: /: already registered, data key dk-/ },
    twice(_s, first, second) {
      const key = (r: Run) => /data key (dk-\S+)/.exec(r.out)?.[1];
      if (key(first) !== key(second)) throw new Error(`a second data key: ${key(first)} then ${key(second)}`);
    },
  }),

  row<{ tenant: string }>({
    command: 'tenant shred',
    async setup() {
      const id = `rep-${suffix()}`;
      await createTenantKeys({ db: t.db, provider: localKeyring(keyring) }).addTenant(id);
      return { args: ['tenant', 'shred', id, '--yes'], scope: { tenant: id } };
    },
    async fingerprint({ tenant: id }) {
      const tenants = await t.db
        .selectFrom('tenant')
        .select('tenant_id')
        .where('tenant_id', '=', id)
        .execute();
      const keys = await t.db.selectFrom('tenant_key').select('kek_id').where('tenant_id', '=', id).execute();
      return { tenants: tenants.length, keys };
    },
    first: { code: 0, out: /^rep-\w+: 1 data key\(s\) destroyed\n$/ },
    second: { code: 0, out: /^rep-\w+: 0 data key\(s\) destroyed\n$/ },
  }),

  row<{ dir: string; file: string }>({
    command: 'keys init',
    async setup() {
      const d = mkdtempSync(join(tmpdir(), 'cairn-repeat-init-'));
      return {
        args: ['keys', 'init', '--file', join(d, 'keyring.json')],
        scope: { dir: d, file: join(d, 'keyring.json') },
      };
    },
    async fingerprint({ dir: d, file }) {
      const k = JSON.parse(readFileSync(file, 'utf8')) as { current: string; keys: Record<string, string> };
      await localKeyring(file).currentKekId(); // valid, and mode 600
      return { files: readdirSync(d), keys: Object.keys(k.keys).length, currentPresent: k.current in k.keys };
    },
    first: { code: 0, out: /: current key-encryption key kek-/ },
    second: { code: 1, err: /keyring.json/ },
  }),

  row<{ dir: string; file: string; before: Record<string, string> }>({
    command: 'keys rotate',
    async setup() {
      const d = mkdtempSync(join(tmpdir(), 'cairn-repeat-rotate-'));
      const file = join(d, 'keyring.json');
      writeKeyring(file);
      const before = (JSON.parse(readFileSync(file, 'utf8')) as { keys: Record<string, string> }).keys;
      return { args: ['keys', 'rotate', '--file', file], scope: { dir: d, file, before } };
    },
    async fingerprint({ dir: d, file, before }) {
      const k = JSON.parse(readFileSync(file, 'utf8')) as { current: string; keys: Record<string, string> };
      await localKeyring(file).currentKekId();
      return {
        files: readdirSync(d),
        earlierKeysKept: Object.entries(before).every(([id, v]) => k.keys[id] === v),
        currentIsNew: k.current in k.keys && !(k.current in before),
      };
    },
    first: { code: 0, out: /: current key-encryption key kek-/ },
    second: { code: 0, out: /: current key-encryption key kek-/ },
    // A keyring write is synchronous and quick: the random delay mostly lands before or after it.
    twice({ file, before }) {
      const n = Object.keys((JSON.parse(readFileSync(file, 'utf8')) as { keys: object }).keys).length;
      if (n !== Object.keys(before).length + 2)
        throw new Error(`expected one more KEK per rotate, found ${n}`);
    },
  }),

  row<{ tenant: string; sealed: Sealed }>({
    command: 'keys rewrap',
    // A database of its own: rewrap touches every data key there, and needs every KEK they are under.
    async setup() {
      const { db, file } = await rewrapDatabase();
      const id = await tenant(db.db);
      const keys = createTenantKeys({ db: db.db, provider: localKeyring(file) });
      await keys.addTenant(id);
      const sealed = await keys.seal(id, Buffer.from('plaintext'), 'aad');
      writeKeyring(file, { rotate: true });
      return {
        args: ['keys', 'rewrap', '--keyring', file],
        env: { DATABASE_URL: db.url },
        scope: { tenant: id, sealed },
      };
    },
    async fingerprint({ tenant: id, sealed }) {
      const { db, file } = await rewrapDatabase();
      const provider = localKeyring(file);
      const rows = await db.db
        .selectFrom('tenant_key')
        .select('kek_id')
        .where('tenant_id', '=', id)
        .execute();
      const opened = await createTenantKeys({ db: db.db, provider }).open(
        id,
        sealed.keyId,
        sealed.bytes,
        'aad',
      );
      return {
        underCurrentKek: rows.map((r) => r.kek_id === JSON.parse(readFileSync(file, 'utf8')).current),
        opens: opened.toString(),
      };
    },
    first: { code: 0, out: /^rewrapped 1 data key\(s\) under kek-/ },
    second: { code: 0, out: /^rewrapped 0 data key\(s\) under kek-/ },
  }),

  row<{ tenant: string }>({
    command: 'retention policy',
    async setup() {
      const id = await tenant();
      return {
        args: ['retention', 'policy', '--tenant', id, '--class', 'internal', '--days', '7'],
        scope: { tenant: id },
      };
    },
    async fingerprint({ tenant: id }) {
      return t.db
        .selectFrom('retention_policy')
        .select(['data_class', 'retain_days'])
        .where('tenant_id', '=', id)
        .execute();
    },
    first: { code: 0, out: /: internal data kept 7 day\(s\) after a task ends\n$/ },
    second: { code: 0, out: /: internal data kept 7 day\(s\) after a task ends\n$/ },
  }),

  row<{ tenant: string; tasks: string[] }>({
    command: 'retention run',
    async setup() {
      const id = await tenant();
      await setRetentionPolicy(t.db, { tenantId: id, dataClass: 'internal', retainDays: 0 });
      const tasks = [await task(id, 'cancelled'), await task(id, 'cancelled'), await task(id, 'cancelled')];
      return { args: ['retention', 'run', '--tenant', id, '--batch', '1'], scope: { tenant: id, tasks } };
    },
    async fingerprint({ tenant: id, tasks }) {
      const remaining = await t.db
        .selectFrom('task_state')
        .select('task_id')
        .where('tenant_id', '=', id)
        .execute();
      const audit = await t.db
        .selectFrom('task_audit')
        .select('version')
        .where('task_id', 'in', tasks)
        .execute();
      const certs = await t.db
        .selectFrom('deletion_certificate')
        .selectAll()
        .where('tenant_id', '=', id)
        .execute();
      const covered = certs
        .flatMap((c) => (c.body.tasks as Array<{ task_id: string }>).map((x) => tasks.indexOf(x.task_id)))
        .sort();
      return {
        remaining: remaining.length,
        audit: audit.length,
        certificates: certs.length,
        covered,
        intact: certs.every(certificateIntact),
      };
    },
    first: {
      code: 0,
      out: /^deleted 3 task\(s\); 0 expired but held; run [0-9a-f-]{36}, 3 certificate\(s\)/,
    },
    second: {
      code: 0,
      out: /^deleted 0 task\(s\); 0 expired but held; run [0-9a-f-]{36}, 0 certificate\(s\)/,
    },
    // One batch, one transaction, one certificate per task (--batch 1): killed after the first.
    killPoint: async ({ tenant: id }) =>
      (await t.db.selectFrom('deletion_certificate').select('run_id').where('tenant_id', '=', id).execute())
        .length > 0,
  }),

  row<{ taskId: string }>({
    command: 'hold place',
    async setup() {
      const taskId = await task(await tenant());
      return {
        args: ['hold', 'place', '--task', taskId, '--reason', 'litigation 2026-17'],
        scope: { taskId },
      };
    },
    async fingerprint({ taskId }) {
      return t.db
        .selectFrom('legal_hold')
        .select(['reason', 'placed_by'])
        .where('task_id', '=', taskId)
        .where('released_at', 'is', null)
        .execute();
    },
    first: { code: 0, out: /^hold [0-9a-f-]{36} on task rep-task-\w+: litigation 2026-17\n$/ },
    second: { code: 0, out: /^already held: [0-9a-f-]{36} on task rep-task-\w+: litigation 2026-17\n$/ },
  }),

  row<{ taskId: string }>({
    command: 'hold release',
    async setup() {
      const taskId = await task(await tenant());
      await placeHold(t.db, { taskId, reason: 'litigation 2026-17', actor: OPERATOR });
      return { args: ['hold', 'release', '--task', taskId], scope: { taskId } };
    },
    async fingerprint({ taskId }) {
      return t.db
        .selectFrom('legal_hold')
        .select((eb) => ['reason', 'released_by', eb('released_at', 'is not', null).as('released')])
        .where('task_id', '=', taskId)
        .execute();
    },
    first: { code: 0, out: /^released 1 hold\(s\)\n$/ },
    second: { code: 0, out: /^released 0 hold\(s\)\n$/ },
  }),

  row<{ taskId: string }>({
    command: 'annotate',
    async setup() {
      const taskId = await task();
      return {
        args: ['annotate', taskId, '--body', 'plan approved by phone, see ticket OPS-88'],
        scope: { taskId },
      };
    },
    async fingerprint({ taskId }) {
      return t.db
        .selectFrom('task_annotation')
        .select(['author', 'body'])
        .where('task_id', '=', taskId)
        .execute();
    },
    first: { code: 0, out: /^annotation [0-9a-f-]{36} added to rep-task-\w+\n$/ },
    second: { code: 0, out: /^annotation [0-9a-f-]{36} added to rep-task-\w+\n$/ },
  }),
];

beforeAll(() => setUp('operator_repeats_keys'));
afterAll(() => tearDown());
runCases(cases);
