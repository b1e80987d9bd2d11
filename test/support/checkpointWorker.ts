/**
 * Crash-test worker: flips a gate on TASK (a boundary, so a checkpoint is taken in the same
 * transaction) and SIGKILLs itself after the checkpoint rows are written, before COMMIT.
 */
import { createCheckpointerWithTestHooks } from '../../src/checkpoints/checkpoints.js';
import { createDb } from '../../src/db/database.js';
import { createTaskStore } from '../../src/state/taskStore.js';

const db = createDb({ connectionString: process.env.DATABASE_URL!, max: 2 });
const checkpointer = createCheckpointerWithTestHooks(
  {
    db,
  },
  { afterInsert: () => process.kill(process.pid, 'SIGKILL') },
);
const store = createTaskStore({ db, checkpointer });
const task = (await store.get(process.env.TASK!))!;
await store.update({
  taskId: task.task_id,
  expectedVersion: task.version,
  patch: { gates: { [process.env.GATE!]: true } },
  actor: 'spiffe://acme.example/agents/doomed',
});
process.stdout.write('not killed\n');
process.exit(3);
