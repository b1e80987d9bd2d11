// Review (outage is not uncertainty): a worker whose effect returned holds its result; a
// Postgres outage of a moment while it records the success must not leave the receipt
// `started` for reconcile to call uncertain and gate (or compensate, or blindly re-run) an
// effect whose outcome this worker knew. Before: runOnce threw the connection error at once,
// the receipt stayed `started`, and once its worker was taken for dead it was gated.
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { Db } from '../../src/db/database.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { dbBehindProxy, type TcpProxy } from '../support/tcpProxy.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
let proxy: TcpProxy;
let cutDb: Db;
let behind: Awaited<ReturnType<typeof dbBehindProxy>>;

beforeAll(async () => {
  t = await createTestDatabase('receipt_success_outage');
  behind = await dbBehindProxy(t.url);
  ({ db: cutDb, proxy } = behind);
  await createTaskStore({ db: t.db }).create({ task: newTask('R-1'), actor: AGENT });
});
afterAll(async () => {
  await behind?.close();
  await t?.drop();
});

it('an effect that returned is recorded succeeded once Postgres answers again; never gated', async () => {
  const receipts = createReceiptStore({ db: cutDb, worker: 'w1', abandonAfterMs: 1000 });
  let calls = 0;
  const input = {
    taskId: 'R-1',
    step: 'charge',
    tool: 'payments.charge',
    args: { amount: 5 },
    onUncertain: 'gate' as const,
    effect: async () => {
      calls++;
      // Postgres goes away while the external call runs, and is back 3 refused connections later.
      proxy.cut((n) => {
        if (n >= 3) proxy.restore();
      });
      return { charge: 'ch_1' };
    },
  };
  const first = await receipts.runOnce(input).catch((err: unknown) => ({ threw: (err as Error).message }));
  proxy.restore();
  const row = await t.db
    .selectFrom('tool_receipt')
    .select(['status'])
    .where('task_id', '=', 'R-1')
    .executeTakeFirstOrThrow();
  // The worker knew the effect ran: the receipt says so.
  expect
    .soft({ first, status: row.status })
    .toMatchObject({ first: { status: 'succeeded' }, status: 'succeeded' });

  // What happens otherwise: past abandonAfterMs, the next look at it gates a known success.
  await new Promise((r) => setTimeout(r, 1200));
  const again = await createReceiptStore({ db: t.db, worker: 'w2', abandonAfterMs: 1000 }).runOnce(input);
  expect(again.status).toBe('succeeded');
  expect(calls).toBe(1);
});
