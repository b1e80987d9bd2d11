// Review (an unanswered call is not a failure): an effect whose call to the external service
// breaks off after the request left (the connection reset, a timeout) does not know whether
// the effect happened. runOnce records every throw as `failed` ("the effect said it did not
// happen: trying again is safe"), so the next runOnce calls a tool that is NOT declared
// idempotent again: a blind retry of an effect that may have run (invariant 7 says an
// uncertain outcome goes to compensation or a human gate).
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase('receipt_effect_timeout');
  await createTaskStore({ db: t.db }).create({ task: newTask('E-1'), actor: AGENT });
});
afterAll(async () => {
  await t?.drop();
});

it('an effect that lost its connection mid-call is not retried blindly', async () => {
  const charged: string[] = [];
  const input = {
    taskId: 'E-1',
    step: 'charge',
    tool: 'payments.charge',
    args: { amount: 5 },
    onUncertain: 'gate' as const,
    effect: async (ctx: { idempotencyKey: string }) => {
      // The payment service took the charge; its answer never arrived.
      charged.push(ctx.idempotencyKey);
      throw Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' });
    },
  };
  const receipts = createReceiptStore({ db: t.db, worker: 'w1' });
  const first = await receipts.runOnce(input);
  const second = await receipts.runOnce(input);
  expect({ first: first.status, second: second.status, calls: charged.length }).toEqual({
    first: expect.not.stringMatching(/^failed$/),
    second: expect.not.stringMatching(/^succeeded|failed$/),
    calls: 1,
  });
});
