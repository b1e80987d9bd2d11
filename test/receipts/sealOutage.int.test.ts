// Review (outage is not uncertainty, with tenant keys): a success's result is sealed under the
// tenant's data key, which may need the key provider. Before, a provider that did not answer
// just then made runOnce throw after the effect ran: the receipt stayed `started`, and once its
// worker was taken for dead it was gated, compensated or run again. A refusal is waited out as
// an outage (review: dropping the result on the first AccessDenied lost it for good); only a
// tenant with no data key left is recorded without its result.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys } from '../../src/crypto/tenantKeys.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { refusingTenant, switchableProvider } from '../support/keyProviders.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
let keyringPath: string;

beforeAll(async () => {
  t = await createTestDatabase('receipt_seal_outage');
  keyringPath = join(mkdtempSync(join(tmpdir(), 'cairn-seal-')), 'keyring.json');
  writeKeyring(keyringPath);
  const keys = createTenantKeys({ db: t.db, provider: localKeyring(keyringPath) });
  await keys.addTenant('acme');
  await keys.addTenant('gone');
  const tasks = createTaskStore({ db: t.db });
  await tasks.create({ task: newTask('S-1'), actor: AGENT });
  await tasks.create({ task: newTask('S-2'), actor: AGENT });
  await tasks.create({ task: newTask('S-3', { tenant_id: 'gone' }), actor: AGENT });
});
afterAll(async () => {
  await t?.drop();
});

const rowOf = (taskId: string) =>
  t.db
    .selectFrom('tool_receipt')
    .select(['status', 'result', 'result_enc', 'result_digest'])
    .where('task_id', '=', taskId)
    .executeTakeFirstOrThrow();

function charge(taskId: string, during: () => void) {
  let calls = 0;
  return {
    calls: () => calls,
    input: {
      taskId,
      step: 'charge',
      tool: 'payments.charge',
      args: { amount: 5 },
      onUncertain: 'gate' as const,
      effect: async () => {
        calls++;
        during();
        return { charge: `ch_${taskId}` };
      },
    },
  };
}

it('a key provider down when the success is sealed: recorded, sealed, once it answers; never left started', async () => {
  const { provider, s } = switchableProvider(localKeyring(keyringPath));
  // Its own TenantKeys: nothing unwrapped is cached, so sealing the result asks the provider.
  const receipts = createReceiptStore({
    db: t.db,
    worker: 'w1',
    abandonAfterMs: 1000,
    keys: createTenantKeys({ db: t.db, provider }),
  });
  const c = charge('S-1', () => {
    s.down = true;
    setTimeout(() => {
      s.down = false;
    }, 400);
  });
  const first = await receipts.runOnce(c.input).catch((err: unknown) => ({ threw: (err as Error).message }));
  expect(s.failures).toBeGreaterThan(0); // the provider was asked while down
  expect(first).toMatchObject({ status: 'succeeded', result: { charge: 'ch_S-1' } });
  const row = await rowOf('S-1');
  expect(row.status).toBe('succeeded');
  expect(row.result_enc).not.toBeNull();
  expect(row.result).toBeNull(); // never in the clear

  // Past abandonAfterMs another worker finds it settled, with its result: the effect ran once.
  await new Promise((r) => setTimeout(r, 1100));
  const again = await createReceiptStore({
    db: t.db,
    worker: 'w2',
    abandonAfterMs: 1000,
    keys: createTenantKeys({ db: t.db, provider: localKeyring(keyringPath) }),
  }).runOnce(c.input);
  expect(again).toMatchObject({ status: 'succeeded', ran: false, result: { charge: 'ch_S-1' } });
  expect(c.calls()).toBe(1);
});

it('a key provider that refuses for a while (a disabled key, an IAM mistake): recorded, sealed, once it answers yes; the result never dropped', async () => {
  const refusing = refusingTenant(localKeyring(keyringPath), 'acme');
  const full = localKeyring(keyringPath);
  let refuse = true;
  const receipts = createReceiptStore({
    db: t.db,
    worker: 'w1',
    abandonAfterMs: 1000,
    keys: createTenantKeys({
      db: t.db,
      provider: {
        currentKekId: () => full.currentKekId(),
        wrap: (id, key, context) => full.wrap(id, key, context),
        unwrap: (id, wrapped, context) => (refuse ? refusing : full).unwrap(id, wrapped, context),
      },
    }),
  });
  const c = charge('S-2', () => {
    setTimeout(() => {
      refuse = false;
    }, 400);
  });
  expect(await receipts.runOnce(c.input)).toMatchObject({
    status: 'succeeded',
    ran: true,
    result: { charge: 'ch_S-2' },
  });
  const row = await rowOf('S-2');
  expect(row.status).toBe('succeeded');
  expect(row.result_enc).not.toBeNull();
});

it('a tenant with no data key left (shredded): the success is recorded without its result, never left started', async () => {
  await t.db.deleteFrom('tenant_key').where('tenant_id', '=', 'gone').execute();
  const receipts = createReceiptStore({
    db: t.db,
    worker: 'w1',
    abandonAfterMs: 1000,
    keys: createTenantKeys({ db: t.db, provider: localKeyring(keyringPath) }),
  });
  const c = charge('S-3', () => {});
  expect(await receipts.runOnce(c.input)).toMatchObject({
    status: 'succeeded',
    ran: true,
    result: { charge: 'ch_S-3' },
  });
  const row = await rowOf('S-3');
  expect(row).toMatchObject({ status: 'succeeded', result: null, result_enc: null });
  expect(row.result_digest).toMatch(/^sha256:/);

  await new Promise((r) => setTimeout(r, 1100));
  const again = await createReceiptStore({ db: t.db, worker: 'w2', abandonAfterMs: 1000 }).runOnce(c.input);
  expect(again).toMatchObject({ status: 'succeeded', ran: false });
  expect(c.calls()).toBe(1);
});
