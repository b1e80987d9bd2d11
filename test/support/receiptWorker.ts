/**
 * A worker process for receipt crash tests. It walks operations op-0..op-(OPS-1) in its own
 * order, each under a 1 s lease, and runs one deploy effect per operation through a receipt
 * against the sink. It SIGKILLs itself at KILL_POINT (after_intent | during_effect |
 * after_effect) on its KILL_AT-th effect; KILL_POINT=none settles everything and exits.
 */
import { createDb } from '../../src/db/database.js';
import { LeaseHeldError, LeaseLostError } from '../../src/errors.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createReceiptStoreWithTestHooks } from '../../src/receipts/receipts.js';
import { callSink } from './effectSink.js';

const db = createDb({ connectionString: process.env.DATABASE_URL!, max: 3 });
const sink = process.env.SINK_URL!;
const ops = Number(process.env.OPS);
const point = process.env.KILL_POINT ?? 'none';
const killAt = Number(process.env.KILL_AT ?? 1);
const worker = process.env.WORKER ?? `w${process.pid}`;
let effects = 0;
const die = (at: string) => {
  if (point === at && effects >= killAt) process.kill(process.pid, 'SIGKILL');
};

const leases = createLeaseManager({ db });
const receipts = createReceiptStoreWithTestHooks(
  {
    db,
  },
  {
    afterIntent: () => {
      effects++;
      die('after_intent');
    },
    afterEffect: () => die('after_effect'),
  },
);

// Skip what is settled already; start at a different operation than the other workers.
const settled = new Set(
  (
    await db
      .selectFrom('tool_receipt')
      .select('task_id')
      .where('step', '=', 'deploy')
      .where('status', 'in', ['succeeded', 'compensated', 'gated'])
      .execute()
  ).map((r) => r.task_id),
);
const start = Number(process.env.START ?? 0);
let unsettled = 0;
for (let n = 0; n < ops; n++) {
  const i = (start + n) % ops;
  if (settled.has(`op-${i}`)) continue;
  try {
    const r = await leases.withLease(
      { taskId: `op-${i}`, branch: 'deploy', agentId: worker, ttlMs: 1000 },
      (lease) =>
        receipts.runOnce({
          taskId: `op-${i}`,
          step: 'deploy',
          tool: 'deployer',
          args: { op: i },
          lease,
          irreversible: true,
          onUncertain: i % 2 === 0 ? 'compensate' : 'gate',
          compensate: ({ idempotencyKey }) => callSink(sink, '/compensate', `op-${i}`, idempotencyKey),
          effect: async ({ idempotencyKey }) => {
            const result = await callSink(sink, '/apply', `op-${i}`, idempotencyKey);
            die('during_effect'); // the sink applied it; the worker dies before the effect returns
            return result;
          },
        }),
    );
    if (r.status === 'in_progress') unsettled++;
  } catch (err) {
    // Another worker holds the lease, or this one lost it before its intent committed (a busy
    // machine: the 1 s lease lapsed): the fence working, the effect did not run. Try later.
    if (err instanceof LeaseHeldError || err instanceof LeaseLostError) unsettled++;
    else throw err;
  }
}
await db.destroy();
process.stdout.write(`${JSON.stringify({ worker, unsettled })}\n`);
process.exit(0);
