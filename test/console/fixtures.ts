import { sql } from 'kysely';
import { expect } from 'vitest';
import type { ConsoleUser } from '../../console/auth.js';
import { parseUsers } from '../../console/auth.js';
import { recordDeadLetter } from '../../consumers/sql/recordDeadLetter.js';
import type { Db } from '../../src/db/database.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { createReceiptStore, createReceiptStoreWithTestHooks } from '../../src/receipts/receipts.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { waitForLeaseExpiry } from '../support/leases.js';

/** Console users for the tests: every role, and an operator bound to tenant-a. */
export const TOKENS = {
  root: 'root-token-0123456789',
  viewer: 'viewer-token-0123456789',
  opsA: 'ops-a-token-0123456789',
} as const;
export const USERS: ConsoleUser[] = parseUsers([
  { name: 'root', role: 'operator', token: TOKENS.root },
  { name: 'viewer', role: 'read', token: TOKENS.viewer },
  { name: 'opsA', role: 'operator', tenant: 'tenant-a', token: TOKENS.opsA },
]);
export const basic = (name: keyof typeof TOKENS) =>
  `Basic ${Buffer.from(`${name}:${TOKENS[name]}`).toString('base64')}`;

/** A task of `tenant` whose deploy receipt is gated: its worker died after writing its intent. */
export async function gatedTask(db: Db, taskId: string, tenant: string): Promise<{ receiptId: string }> {
  const store = createTaskStore({ db });
  await store.create({ task: newTask(taskId, { tenant_id: tenant }), actor: AGENT });
  const leases = createLeaseManager({ db });
  const lease = await leases.acquire({ taskId, branch: 'deploy', agentId: 'doomed', ttlMs: 200 });
  if (!lease.ok) throw new Error('lease');
  const dying = createReceiptStoreWithTestHooks(
    { db },
    {
      afterIntent: () => {
        throw new Error('worker died');
      },
    },
  );
  const deploy = { taskId, step: 'deploy', tool: 'deployer', args: { to: 'prod' } };
  await expect(
    dying.runOnce({ ...deploy, lease, onUncertain: 'gate', effect: async () => 'never' }),
  ).rejects.toThrow('worker died');
  await waitForLeaseExpiry(db, taskId, 'deploy');
  const gated = await createReceiptStore({ db }).runOnce({
    ...deploy,
    onUncertain: 'gate',
    gate: { store, actor: 'spiffe://acme.example/cairn/receipts' },
    effect: async () => 'never',
  });
  expect(gated.status).toBe('gated');
  return { receiptId: gated.receiptId };
}

/**
 * A parked key as the relay leaves it when the broker refuses a key's head message: the
 * message stays in the outbox and the key is parked with the refusal (rows written here as
 * the relay writes them; the relay's own parking is proven in test/relay/poisonIsolation).
 */
export async function parkedKey(db: Db, topic: string, key: string, tenantId: string): Promise<string> {
  const [messageId] = await db
    .transaction()
    .execute((t) => createOutbox().enqueue(t, [{ topic, key, payload: { n: 1 } }], { tenantId }));
  await sql`INSERT INTO outbox_parked_key (tenant, topic, key, message_id, error)
            VALUES (${tenantId}, ${topic}, ${key}, ${messageId}::uuid, 'MESSAGE_TOO_LARGE: refused by the broker')`.execute(
    db,
  );
  return messageId!;
}

/** A dead letter of `groupId`, recorded by the inbox's own function. */
export async function deadLetter(
  db: Db,
  a: { groupId: string; topic: string; messageId: string; tenantId: string },
): Promise<void> {
  await db.transaction().execute((trx) =>
    recordDeadLetter(trx, {
      groupId: a.groupId,
      message: {
        messageId: a.messageId,
        topic: a.topic,
        partition: 0,
        offset: '0',
        key: 'k1',
        tenantId: a.tenantId,
        headers: { 'cairn-message-id': a.messageId, 'cairn-tenant': a.tenantId },
        value: Buffer.from('{"poison":true}'),
        taskId: undefined,
        taskVersion: undefined,
        taskSeq: 0,
        json: <T>() => ({ poison: true }) as T,
      },
      error: 'handler threw: cannot parse order',
      attempts: 5,
    }),
  );
}

/** The form token the console's pages give this user (from /humans, which lists the gated receipts). */
export async function formOf(base: string, auth: string): Promise<{ csrf: string }> {
  const page = await (await fetch(`${base}/humans`, { headers: { authorization: auth } })).text();
  const csrf = /name="csrf" value="([^"]+)"/.exec(page)?.[1];
  if (!csrf) throw new Error('no form token on /humans: the page has nothing to act on');
  return { csrf };
}
