/**
 * End-to-end crash worker: takes the lease of TASK, crosses a boundary (review passed, with a
 * message for the other agents, checkpointed in the same transaction), then dies by SIGKILL
 * before the irreversible deploy effect.
 */
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { createDb } from '../../src/db/database.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createTaskStore } from '../../src/state/taskStore.js';

const db = createDb({ connectionString: process.env.DATABASE_URL!, max: 2 });
const store = createTaskStore({ db, checkpointer: createCheckpointer({ db }) });
const leases = createLeaseManager({ db });
const lease = await leases.acquire({
  taskId: process.env.TASK!,
  branch: 'main',
  agentId: 'worker-a',
  // Long enough for the get and the fenced update on a machine busy with another crash test.
  ttlMs: 5000,
});
if (!lease.ok) throw new Error('lease held');
const task = (await store.get(process.env.TASK!))!;
const r = await store.update({
  taskId: task.task_id,
  expectedVersion: task.version,
  patch: { status: 'testing', gates: { review_passed: true } },
  actor: 'spiffe://acme.example/agents/worker-a',
  lease,
  messages: [{ topic: process.env.TOPIC!, payload: { event: 'review_passed', task: task.task_id } }],
});
if (!r.ok) throw r.error;
process.kill(process.pid, 'SIGKILL'); // before the deploy effect
