// The demo's and the soaks' verification (scripts/demo/verify.ts) counts every open receipt
// but those of the tasks it leaves out: after a failover it leaves out the held tasks (their
// receipts stay as they were at the promotion), and once it counted only the checked tasks'
// receipts, a receipt whose task row was gone went unseen.
import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { verifyTasks } from '../../scripts/demo/verify.js';
import { type Sink, startSink } from '../../scripts/lib/effectSink.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
let sink: Sink;
beforeAll(async () => {
  t = await createTestDatabase('verify_receipts');
  sink = await startSink();
});
afterAll(async () => {
  await sink?.close();
  await t?.drop();
});

async function openReceipt(taskId: string): Promise<void> {
  await sql`INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status, worker)
            VALUES (${randomUUID()}, ${`deploy:${taskId}`}, ${taskId}, 'deploy', 'deploy', 'd', 'started', 'w')`.execute(
    t.db,
  );
}

it('an open receipt whose task row is gone is counted; one of a task left out (held) is not', async () => {
  await openReceipt('demo-gone');
  await openReceipt('demo-held');
  const checks = await verifyTasks(t.db, sink, {
    only: (id) => id.startsWith('demo-') && id !== 'demo-held',
  });
  expect(checks.find((c) => c.name === 'receipts settled')).toMatchObject({
    actual: '1 open',
    violations: 1,
  });
});
