import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseUsers } from '../../console/auth.js';
import { createConsoleApp, type RunningConsole, startConsole } from '../../console/server.js';
import { createDb, type Db } from '../../src/db/database.js';
import { ValidationError } from '../../src/errors.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { laneOf } from '../../src/outbox/lanes.js';
import { skipMessage } from '../../src/outbox/operator.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { twoTenants } from '../support/tenants.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { readTopic } from '../support/topicReader.js';
import { basic, deadLetter, formOf, gatedTask, parkedKey, USERS } from './fixtures.js';

// What the review of the console found (a tenant's own SQL, a broker that is down, a request
// killed half-way, repeats), each as it was reproduced, and what must happen instead.

let tdb: TestDatabase;
let asA: Db;
let app: Db;
let running: RunningConsole;
let kafkaUp = false;
const OPERATOR = 'spiffe://acme.example/operator/alice';

beforeAll(async () => {
  tdb = await createTestDatabase('console_adversary');
  ({ app, asA } = await twoTenants(tdb));
  await gatedTask(tdb.db, 'a-1', 'tenant-a'); // /humans has a form for every user
  running = await startConsole({
    db: tdb.db,
    users: USERS,
    port: 0,
    // The broker answers only when the test says so (127.0.0.1:1 refuses every connection).
    publisher: () => createKafkaPublisher({ brokers: kafkaUp ? kafkaBrokers() : ['127.0.0.1:1'] }),
  });
});
afterAll(async () => {
  await running?.close();
  await app?.destroy();
  await tdb?.drop();
});

const act = async (user: 'root' | 'opsA', action: string, form: Record<string, string>) => {
  const { csrf } = await formOf(running.url, basic(user));
  const r = await fetch(`${running.url}/actions/${action}`, {
    method: 'POST',
    body: new URLSearchParams({ request_id: randomUUID(), csrf, ...form }),
    headers: { authorization: basic(user) },
  });
  return { status: r.status, text: await r.text() };
};

describe('the console against a tenant that writes its own rows', () => {
  it("skip: tenant A's operator, given B's message id that A planted under its own tenant, drops A's row only, never B's", async () => {
    const victim = await parkedKey(tdb.db, 'orders', 'kb', 'tenant-b');
    // Message ids are unique per tenant: A's role may insert a row with B's id.
    await sql`INSERT INTO outbox (lane, message_id, topic, key, headers, payload)
              VALUES (${laneOf('ka')}, ${victim}::uuid, 'evil', 'ka', '{}', '\\x00')`.execute(asA);
    const r = await act('opsA', 'outbox.skip', { message_id: victim, tenant: 'tenant-b', reason: 'mine' });
    expect(r.status).toBe(200);
    const left = await tdb.db
      .selectFrom('outbox')
      .select(['tenant_id', 'topic'])
      .where('message_id', '=', victim)
      .execute();
    expect(left).toEqual([{ tenant_id: 'tenant-b', topic: 'orders' }]);
    const audit = await tdb.db
      .selectFrom('outbox_operator_audit')
      .select(['tenant', 'topic'])
      .where('message_id', '=', victim)
      .execute();
    expect(audit).toEqual([{ tenant: 'tenant-a', topic: 'evil' }]);
  });

  it('skip through the library: an id two tenants share is refused without a tenant, naming both, and nothing is dropped', async () => {
    const id = await parkedKey(tdb.db, 'orders', 'kc', 'tenant-b');
    await sql`INSERT INTO outbox (lane, message_id, topic, key, headers, payload)
              VALUES (${laneOf('kc')}, ${id}::uuid, 'evil', 'kc', '{}', '\\x00')`.execute(asA);
    await expect(skipMessage(tdb.db, { messageId: id, actor: OPERATOR, reason: 'x' })).rejects.toThrow(
      /tenants (tenant-a, tenant-b|tenant-b, tenant-a): name one/,
    );
    expect(
      await tdb.db.selectFrom('outbox').select('tenant_id').where('message_id', '=', id).execute(),
    ).toHaveLength(2);
    await skipMessage(tdb.db, { messageId: id, tenant: 'tenant-a', actor: OPERATOR, reason: 'x' });
    expect(
      await tdb.db.selectFrom('outbox').select('tenant_id').where('message_id', '=', id).execute(),
    ).toEqual([{ tenant_id: 'tenant-b' }]);
  });

  it("quarantine: a tenant that writes a task under the id of a task the failover found gone cannot release that task's quarantine", async () => {
    await tdb.db
      .insertInto('task_quarantine')
      .values({ task_id: 'lost-1', reason: 'failover: gone', placed_by: OPERATOR })
      .execute();
    await createTaskStore({ db: asA }).create({
      task: newTask('lost-1', { tenant_id: 'tenant-a' }),
      actor: AGENT,
    });
    const r = await act('opsA', 'quarantine.release', { task_id: 'lost-1' });
    expect(r.text).toContain('data-outcome="already"');
    const q = await tdb.db
      .selectFrom('task_quarantine')
      .select(['released_at', 'tenant_id'])
      .where('task_id', '=', 'lost-1')
      .execute();
    expect(q).toEqual([{ released_at: null, tenant_id: null }]);
  });

  it('a task page stays readable (and its hold form there) when the tenant wrote an audit row whose patch is not a patch', async () => {
    await createTaskStore({ db: asA }).create({
      task: newTask('a-plain', { tenant_id: 'tenant-a' }),
      actor: AGENT,
    });
    await sql`INSERT INTO task_audit (task_id, version, actor, patch, at)
              VALUES ('a-plain', 99, 'x', '"notanarray"', now())`.execute(asA);
    const r = await fetch(`${running.url}/tasks/a-plain`, { headers: { authorization: basic('opsA') } });
    expect(r.status).toBe(200);
    const page = await r.text();
    expect(page).toContain('not a JSON patch');
    expect(page).toContain('data-action="hold.place"');
  });
});

describe('the console when a dependency is down, a request dies half-way, or an operator repeats', () => {
  it('replay while Kafka is down: 503, the letter is not marked replayed and still offered; the same form sent again once Kafka is back replays it', async () => {
    const topic = await createTestTopic('console-replay', 1);
    const messageId = randomUUID();
    await deadLetter(tdb.db, { groupId: 'billing', topic, messageId, tenantId: 'tenant-a' });
    kafkaUp = false;
    const { csrf } = await formOf(running.url, basic('root'));
    const form = {
      request_id: randomUUID(),
      csrf,
      message_id: messageId,
      group: 'billing',
      tenant: 'tenant-a',
    };
    const post = () =>
      fetch(`${running.url}/actions/deadletter.replay`, {
        method: 'POST',
        body: new URLSearchParams(form),
        headers: { authorization: basic('root') },
      });
    const down = await post();
    expect(down.status).toBe(503);
    expect(await down.text()).toMatch(/broker did not answer the dead-letter replay/);
    const row = await tdb.db
      .selectFrom('inbox_dlq')
      .select('replayed_at')
      .where('message_id', '=', messageId)
      .executeTakeFirstOrThrow();
    expect(row.replayed_at).toBeNull();
    expect(
      await tdb.db.selectFrom('inbox').select('outcome').where('message_id', '=', messageId).execute(),
    ).toEqual([{ outcome: 'dead_lettered' }]);
    const bus = await (
      await fetch(`${running.url}/bus`, { headers: { authorization: basic('root') } })
    ).text();
    expect(bus).toContain(messageId);
    expect(
      await tdb.db
        .selectFrom('console_action')
        .select('outcome')
        .where('request_id', '=', form.request_id)
        .execute(),
    ).toEqual([{ outcome: 'failed' }]);

    kafkaUp = true;
    const back = await post();
    expect(await back.text()).toContain('data-outcome="done"');
    const seen = await readTopic(
      kafkaClient(kafkaBrokers(), 'console-adversary'),
      topic,
      (ms) => ms.length >= 1,
      30_000,
    );
    expect(seen.map((m) => m.headers['cairn-message-id'])).toEqual([messageId]);
    const again = await act('root', 'deadletter.replay', {
      message_id: messageId,
      group: 'billing',
      tenant: 'tenant-a',
    });
    expect(again.text).toContain('data-outcome="already"');
  });

  it('two tenants with a dead letter of the same id in one group: each is replayed from its own form, with its own tenant', async () => {
    kafkaUp = true;
    const topic = await createTestTopic('console-replay-two', 1);
    const messageId = randomUUID();
    for (const tenantId of ['tenant-a', 'tenant-b'])
      await deadLetter(tdb.db, { groupId: 'shipping', topic, messageId, tenantId });
    for (const tenant of ['tenant-b', 'tenant-a']) {
      const r = await act('root', 'deadletter.replay', { message_id: messageId, group: 'shipping', tenant });
      expect(r.text).toContain('data-outcome="done"');
    }
    const seen = await readTopic(
      kafkaClient(kafkaBrokers(), 'console-adversary'),
      topic,
      (ms) => ms.length >= 2,
      30_000,
    );
    expect(seen.map((m) => m.headers['cairn-tenant']).sort()).toEqual(['tenant-a', 'tenant-b']);
  });

  it('a request left pending by a console that died is taken again after a while; a fresh one in flight is not', async () => {
    const { receiptId } = await gatedTask(tdb.db, 'a-pending', 'tenant-a');
    const requestId = randomUUID();
    const row = {
      request_id: requestId,
      actor: 'spiffe://cairn.console/operator/root',
      role: 'operator' as const,
      action: 'receipt.resolve',
      target: `receipt:${receiptId}`,
    };
    await tdb.db.insertInto('console_action').values(row).execute();
    const { csrf } = await formOf(running.url, basic('root'));
    const form = {
      request_id: requestId,
      csrf,
      receipt_id: receiptId,
      outcome: 'succeeded',
      reason: 'checked',
    };
    const post = async () =>
      (
        await fetch(`${running.url}/actions/receipt.resolve`, {
          method: 'POST',
          body: new URLSearchParams(form),
          headers: { authorization: basic('root') },
        })
      ).text();
    expect(await post()).toContain('still running');
    await sql`UPDATE console_action SET at = now() - interval '1 hour' WHERE request_id = ${requestId}::uuid`.execute(
      tdb.db,
    );
    expect(await post()).toContain('data-outcome="done"');
    expect(
      (
        await tdb.db
          .selectFrom('tool_receipt')
          .select('status')
          .where('receipt_id', '=', receiptId)
          .executeTakeFirstOrThrow()
      ).status,
    ).toBe('succeeded');
  });

  it('a hold placed again with the same reason (spaces aside) is "already", and there is one hold', async () => {
    await createTaskStore({ db: tdb.db }).create({
      task: newTask('a-hold', { tenant_id: 'tenant-a' }),
      actor: AGENT,
    });
    expect((await act('root', 'hold.place', { task_id: 'a-hold', reason: 'lit' })).text).toContain(
      'data-outcome="done"',
    );
    expect((await act('root', 'hold.place', { task_id: 'a-hold', reason: 'lit ' })).text).toContain(
      'data-outcome="already"',
    );
    expect(
      await tdb.db.selectFrom('legal_hold').select('reason').where('task_id', '=', 'a-hold').execute(),
    ).toEqual([{ reason: 'lit' }]);
  });

  it('a receipt id that is not a UUID is a 400 naming it, not a database error', async () => {
    const r = await act('root', 'receipt.resolve', { receipt_id: 'nope', outcome: 'succeeded', reason: 'x' });
    expect(r.status).toBe(400);
    expect(r.text).toMatch(/receipt_id.*nope/);
  });

  it("a legal hold on tenant A's task is not tenant A's operator's to release (placed against the tenant, often)", async () => {
    await createTaskStore({ db: asA }).create({
      task: newTask('a-held', { tenant_id: 'tenant-a' }),
      actor: AGENT,
    });
    const placed = await act('root', 'hold.place', { task_id: 'a-held', reason: 'litigation 2026-88' });
    expect(placed.text).toContain('data-outcome="done"');
    const page = await fetch(`${running.url}/tasks/a-held`, { headers: { authorization: basic('opsA') } });
    expect(await page.text()).toMatch(/data-action="hold.release" disabled/);
    const r = await act('opsA', 'hold.release', { task_id: 'a-held' });
    expect(r.status).toBe(409);
    expect(r.text).toContain('released by an operator bound to no tenant');
    const active = await tdb.db
      .selectFrom('legal_hold')
      .select('task_id')
      .where('task_id', '=', 'a-held')
      .where('released_at', 'is', null)
      .execute();
    expect(active).toHaveLength(1);
    // Placing one stays open to it: a hold only keeps data.
    await createTaskStore({ db: asA }).create({
      task: newTask('a-keep', { tenant_id: 'tenant-a' }),
      actor: AGENT,
    });
    expect((await act('opsA', 'hold.place', { task_id: 'a-keep', reason: 'our own audit' })).text).toContain(
      'data-outcome="done"',
    );
  });

  it('Postgres down: every page answers 503 naming Postgres, not 500', async () => {
    const dead = createDb({ connectionString: 'postgres://postgres@127.0.0.1:1/none', max: 1 });
    const consoleApp = createConsoleApp({ db: dead, users: USERS });
    for (const path of ['/tasks', '/tasks/a-1', '/bus', '/humans', '/api/live']) {
      const r = await consoleApp.fetch(
        new Request(`http://127.0.0.1${path}`, { headers: { authorization: basic('root') } }),
      );
      expect(r.status, path).toBe(503);
      expect(await r.text()).toContain('Postgres is unavailable');
    }
    await consoleApp.close();
    await dead.destroy();
  });

  it('"back" after an action leads only to a page of the console itself', async () => {
    const { csrf } = await formOf(running.url, basic('root'));
    for (const referer of ['http://evil.example/tasks', `${running.url}/\\evil.example/p`]) {
      const r = await fetch(`${running.url}/actions/hold.release`, {
        method: 'POST',
        body: new URLSearchParams({ request_id: randomUUID(), csrf, task_id: 'a-1' }),
        headers: { authorization: basic('root'), referer },
      });
      expect(await r.text()).toContain('<a href="/tasks">back</a>');
    }
  });

  it('users: two with one name, one audit id or one token are refused, naming the field', () => {
    const base = { role: 'read', token: 'a-token-0123456789' } as const;
    expect(() =>
      parseUsers([
        { ...base, name: 'a' },
        { ...base, name: 'a', token: 'another-token-012345' },
      ]),
    ).toThrow(/1\.name.*twice/);
    expect(() =>
      parseUsers([
        { ...base, name: 'a', id: 'spiffe://x.example/op' },
        { ...base, name: 'b', token: 'another-token-012345', id: 'spiffe://x.example/op' },
      ]),
    ).toThrow(/1\.id.*twice/);
    expect(() =>
      parseUsers([
        { ...base, name: 'a' },
        { ...base, name: 'b' },
      ]),
    ).toThrow(ValidationError);
  });
});
