import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ACTION_NAMES } from '../../console/actions.js';
import { type RunningConsole, startConsole } from '../../console/server.js';
import { registerTenant } from '../../src/db/tenant.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { basic, formOf, gatedTask, TOKENS, USERS } from './fixtures.js';

// The console over HTTP: who may see and do what, and an action done once per request.
// (The browser drives the same pages in console.browser.int.test.ts.)

let tdb: TestDatabase;
let consoleApp: RunningConsole;
const receipts: Record<string, string> = {};

beforeAll(async () => {
  tdb = await createTestDatabase('console_http');
  for (const t of ['tenant-a', 'tenant-b']) await registerTenant(tdb.db, t);
  const made = await Promise.all([
    gatedTask(tdb.db, 'a-1', 'tenant-a'),
    gatedTask(tdb.db, 'a-2', 'tenant-a'),
    gatedTask(tdb.db, 'a-3', 'tenant-a'),
    gatedTask(tdb.db, 'b-1', 'tenant-b'),
  ]);
  ['a-1', 'a-2', 'a-3', 'b-1'].forEach((id, i) => {
    receipts[id] = made[i]!.receiptId;
  });
  consoleApp = await startConsole({ db: tdb.db, users: USERS, port: 0 });
});
afterAll(async () => {
  await consoleApp?.close();
  await tdb?.drop();
});

const get = (path: string, auth?: string) =>
  fetch(`${consoleApp.url}${path}`, auth ? { headers: { authorization: auth } } : {});
const post = (path: string, form: Record<string, string>, headers: Record<string, string> = {}) =>
  fetch(`${consoleApp.url}${path}`, { method: 'POST', body: new URLSearchParams(form), headers });

async function receiptRow(taskId: string) {
  return tdb.db
    .selectFrom('tool_receipt')
    .select(['status', 'resolution'])
    .where('receipt_id', '=', receipts[taskId]!)
    .executeTakeFirstOrThrow();
}
const actionsRecorded = async () =>
  (await tdb.db.selectFrom('console_action').selectAll().orderBy('id').execute()).length;

describe('cairn console: receipts left for a retry', () => {
  it('lists, for its tenant only, an uncertain receipt no worker has run again for more than 5 minutes; not one just left', async () => {
    const store = createTaskStore({ db: tdb.db });
    const uncertain = async (taskId: string, tenant: string, startedAgo: string, leftAgo?: string) => {
      await store.create({ task: newTask(taskId, { tenant_id: tenant }), actor: AGENT });
      const { rows } = await sql<{ receipt_id: string }>`
        INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status, worker, started_at)
        VALUES (gen_random_uuid(), ${`${taskId}/deploy`}, ${taskId}, 'deploy', 'deployer', 'sha256:aa', 'started', 'gone',
                now() - ${startedAgo}::interval)
        RETURNING receipt_id`.execute(tdb.db);
      await sql`UPDATE tool_receipt SET status = 'uncertain',
                       finished_at = ${leftAgo === undefined ? null : sql`now() - ${leftAgo}::interval`}
                 WHERE receipt_id = ${rows[0]!.receipt_id}`.execute(tdb.db);
      return rows[0]!.receipt_id;
    };
    const overdue = await uncertain('a-9', 'tenant-a', '1 hour');
    const fresh = await uncertain('a-8', 'tenant-a', '10 seconds');
    const other = await uncertain('b-9', 'tenant-b', '1 hour');
    // Started an hour ago, its attempt left 10 seconds ago (a reconcile found its worker dead):
    // its retry is not late.
    const justLeft = await uncertain('a-7', 'tenant-a', '1 hour', '10 seconds');
    const leftLongAgo = await uncertain('a-6', 'tenant-a', '1 hour', '30 minutes');
    const waiting = (page: string) =>
      page.slice(page.indexOf('waiting for a retry'), page.indexOf('Quarantined tasks'));

    const forA = waiting(await (await get('/humans', basic('opsA'))).text());
    expect(forA).toContain(overdue);
    expect(forA).toContain('/tasks/a-9');
    expect(forA).not.toContain(fresh);
    expect(forA).not.toContain(justLeft);
    expect(forA).toContain(leftLongAgo);
    expect(forA).not.toContain(other);
    expect(waiting(await (await get('/humans', basic('root'))).text())).toContain(other);

    // A tenant's role can make receipts without end: the list shows the oldest 100 and says more wait.
    await store.create({ task: newTask('b-many', { tenant_id: 'tenant-b' }), actor: AGENT });
    await sql`INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status, worker, started_at)
              SELECT gen_random_uuid(), 'b-many/' || i, 'b-many', 'step-' || i, 'deployer', 'sha256:aa', 'started', 'gone',
                     now() - interval '2 hours'
                FROM generate_series(1, 101) AS i`.execute(tdb.db);
    await sql`UPDATE tool_receipt SET status = 'uncertain' WHERE task_id = 'b-many'`.execute(tdb.db);
    const flooded = waiting(await (await get('/humans', basic('root'))).text());
    expect(flooded).toContain('The oldest 100 are shown; more wait.');
    expect(flooded.match(/<tr data-receipt=/g)).toHaveLength(100);
  });
});

describe('cairn console: access', () => {
  it('no anonymous access: every page and action answers 401 without credentials, with a wrong token, or an unknown bearer', async () => {
    const pages = ['/tasks', '/tasks/a-1', '/bus', '/humans', '/api/live', '/live'];
    for (const auth of [
      undefined,
      `Basic ${Buffer.from('root:wrong-token-0000000').toString('base64')}`,
      'Bearer nope',
    ]) {
      for (const p of pages) {
        const r = await get(p, auth);
        expect(r.status, `${p} with ${auth ?? 'no credentials'}`).toBe(401);
        expect(r.headers.get('www-authenticate')).toMatch(/^Basic realm="cairn console"/);
        await r.body?.cancel();
      }
      for (const a of ACTION_NAMES) {
        const r = await post(
          `/actions/${a}`,
          { request_id: randomUUID() },
          auth ? { authorization: auth } : {},
        );
        expect(r.status, `${a} with ${auth ?? 'no credentials'}`).toBe(401);
      }
    }
    expect((await get('/healthz')).status).toBe(200);
    expect(await actionsRecorded()).toBe(0);
  });

  it('a read-only user sees every page and gets 403 on every action: nothing is recorded or changed', async () => {
    for (const p of ['/tasks', '/tasks/a-1', '/bus', '/humans', '/api/live']) {
      expect((await get(p, basic('viewer'))).status, p).toBe(200);
    }
    const { csrf } = await formOf(consoleApp.url, basic('viewer'));
    for (const a of ACTION_NAMES) {
      const r = await post(
        `/actions/${a}`,
        {
          request_id: randomUUID(),
          csrf,
          receipt_id: receipts['a-1']!,
          outcome: 'succeeded',
          reason: 'x',
          task_id: 'a-1',
        },
        { authorization: basic('viewer') },
      );
      expect(r.status, a).toBe(403);
      expect(await r.text()).toContain('viewer is read-only');
    }
    // Also with a bearer token (no form token needed, still no write).
    const r = await post(
      '/actions/receipt.resolve',
      { request_id: randomUUID(), receipt_id: receipts['a-1']!, outcome: 'succeeded', reason: 'x' },
      { authorization: `Bearer ${TOKENS.viewer}` },
    );
    expect(r.status).toBe(403);
    expect(await actionsRecorded()).toBe(0);
    expect(await receiptRow('a-1')).toMatchObject({ status: 'gated' });
  });

  it("tenant A's operator sees A's rows only: B's task by URL is 404, B's receipt cannot be resolved, a tenant filter cannot widen the view", async () => {
    const list = await (await get('/tasks', basic('opsA'))).text();
    expect(list).toContain('/tasks/a-1');
    expect(list).not.toContain('b-1');
    expect(await (await get('/tasks?tenant=tenant-b', basic('opsA'))).text()).not.toContain('b-1');
    const b = await get('/tasks/b-1', basic('opsA'));
    expect(b.status).toBe(404);
    expect(await b.text()).not.toContain('tenant-b');
    expect((await get('/tasks/a-1', basic('opsA'))).status).toBe(200);
    const humans = await (await get('/humans', basic('opsA'))).text();
    expect(humans).toContain(receipts['a-1']);
    expect(humans).not.toContain(receipts['b-1']);

    const { csrf } = await formOf(consoleApp.url, basic('opsA'));
    const forB = await post(
      '/actions/receipt.resolve',
      {
        request_id: randomUUID(),
        csrf,
        receipt_id: receipts['b-1']!,
        outcome: 'succeeded',
        reason: 'not mine',
      },
      { authorization: basic('opsA') },
    );
    expect(forB.status).toBe(404);
    const hold = await post(
      '/actions/hold.place',
      { request_id: randomUUID(), csrf, task_id: 'b-1', reason: 'not mine' },
      { authorization: basic('opsA') },
    );
    expect(hold.status).toBe(404);
    expect(await receiptRow('b-1')).toMatchObject({ status: 'gated' });
    expect(await tdb.db.selectFrom('legal_hold').selectAll().execute()).toEqual([]);
    // The root operator sees both tenants.
    const all = await (await get('/tasks', basic('root'))).text();
    expect(all).toContain('/tasks/a-1');
    expect(all).toContain('/tasks/b-1');
  });

  it('a form posted with basic auth needs the form token and must not come from another site; a bearer client needs neither', async () => {
    const form = {
      request_id: randomUUID(),
      receipt_id: receipts['a-3']!,
      outcome: 'failed',
      reason: 'csrf test',
    };
    expect((await post('/actions/receipt.resolve', form, { authorization: basic('root') })).status).toBe(403);
    const { csrf } = await formOf(consoleApp.url, basic('root'));
    const { csrf: otherUsers } = await formOf(consoleApp.url, basic('opsA'));
    expect(
      (
        await post(
          '/actions/receipt.resolve',
          { ...form, csrf: otherUsers },
          { authorization: basic('root') },
        )
      ).status,
    ).toBe(403);
    expect(
      (
        await post(
          '/actions/receipt.resolve',
          { ...form, csrf },
          { authorization: basic('root'), 'sec-fetch-site': 'cross-site' },
        )
      ).status,
    ).toBe(403);
    expect(await receiptRow('a-3')).toMatchObject({ status: 'gated' });
    const bearer = await post('/actions/receipt.resolve', form, { authorization: `Bearer ${TOKENS.root}` });
    expect(bearer.status).toBe(200);
    expect(await receiptRow('a-3')).toMatchObject({ status: 'failed' });
  });
});

describe('cairn console: actions', () => {
  it('bad input is a 400 that names the field and the value, and changes nothing', async () => {
    const { csrf } = await formOf(consoleApp.url, basic('root'));
    const bad = await post(
      '/actions/receipt.resolve',
      { request_id: randomUUID(), csrf, receipt_id: receipts['a-2']!, outcome: 'deleted', reason: 'x' },
      { authorization: basic('root') },
    );
    expect(bad.status).toBe(400);
    expect(await bad.text()).toMatch(/outcome.*deleted/);
    const noReason = await post(
      '/actions/receipt.resolve',
      { request_id: randomUUID(), csrf, receipt_id: receipts['a-2']!, outcome: 'succeeded', reason: '  ' },
      { authorization: basic('root') },
    );
    expect(noReason.status).toBe(400);
    expect(await noReason.text()).toContain('reason');
    const badId = await post(
      '/actions/receipt.resolve',
      { request_id: 'twice', csrf, receipt_id: receipts['a-2']!, outcome: 'succeeded', reason: 'x' },
      { authorization: basic('root') },
    );
    expect(badId.status).toBe(400);
    expect(await badId.text()).toMatch(/request_id.*twice/);
    expect(
      (
        await post(
          '/actions/drop.table',
          { request_id: randomUUID(), csrf },
          { authorization: basic('root') },
        )
      ).status,
    ).toBe(400);
    expect(await receiptRow('a-2')).toMatchObject({ status: 'gated' });
  });

  it("a gated receipt resolved by tenant A's operator: recorded with their id; a double click (same request) acts once, a second command finds it done", async () => {
    const before = await actionsRecorded();
    const { csrf } = await formOf(consoleApp.url, basic('opsA'));
    const form = {
      request_id: randomUUID(),
      csrf,
      receipt_id: receipts['a-1']!,
      outcome: 'succeeded',
      reason: 'the deploy is live, checked by hand',
    };
    // Two submissions of the same form at once: one acts, the other answers with it.
    const [r1, r2] = await Promise.all([
      post('/actions/receipt.resolve', form, { authorization: basic('opsA') }),
      post('/actions/receipt.resolve', form, { authorization: basic('opsA') }),
    ]);
    const texts = [await r1.text(), await r2.text()];
    expect([r1.status, r2.status]).toEqual([200, 200]);
    expect(texts.filter((t) => t.includes('data-outcome="done"'))).toHaveLength(1);
    expect(texts.filter((t) => t.includes('nothing ran again'))).toHaveLength(1);
    const row = await receiptRow('a-1');
    expect(row.status).toBe('succeeded');
    expect(row.resolution).toBe('spiffe://cairn.console/operator/opsA: the deploy is live, checked by hand');

    const again = await post(
      '/actions/receipt.resolve',
      { ...form, request_id: randomUUID() },
      { authorization: basic('opsA') },
    );
    expect(await again.text()).toContain('data-outcome="already"');
    const recorded = await tdb.db
      .selectFrom('console_action')
      .select(['actor', 'role', 'scope_tenant', 'action', 'target', 'outcome'])
      .orderBy('id')
      .offset(before)
      .execute();
    expect(recorded).toEqual([
      {
        actor: 'spiffe://cairn.console/operator/opsA',
        role: 'operator',
        scope_tenant: 'tenant-a',
        action: 'receipt.resolve',
        target: `receipt:${receipts['a-1']}`,
        outcome: 'done',
      },
      expect.objectContaining({ outcome: 'already' }),
    ]);
  });

  it('a request id cannot be reused for another action or target', async () => {
    const { csrf } = await formOf(consoleApp.url, basic('root'));
    const requestId = randomUUID();
    const first = await post(
      '/actions/hold.place',
      { request_id: requestId, csrf, task_id: 'a-2', reason: 'litigation 7' },
      { authorization: basic('root') },
    );
    expect(await first.text()).toContain('data-outcome="done"');
    const reused = await post(
      '/actions/hold.place',
      { request_id: requestId, csrf, task_id: 'b-1', reason: 'litigation 7' },
      { authorization: basic('root') },
    );
    expect(reused.status).toBe(400);
    expect(await reused.text()).toContain('was used for another action');
    const holds = await tdb.db.selectFrom('legal_hold').select(['task_id', 'placed_by']).execute();
    expect(holds).toEqual([{ task_id: 'a-2', placed_by: 'spiffe://cairn.console/operator/root' }]);
  });
});
