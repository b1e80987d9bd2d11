import type { Db } from '../../src/db/database.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { workflowDigestOf } from '../../src/recovery/resume.js';
import type { TaskStore } from '../../src/state/taskStore.js';
import { topicOf, WORKFLOW_DEFINITION } from './workflow.js';

export const demoTaskId = (i: number) => `demo-${String(i).padStart(4, '0')}`;

/** Creates demo task `i` in planning and, in the same transaction, its message to the planner. */
export async function createDemoTask(db: Db, store: TaskStore, run: string, i: number): Promise<string> {
  const taskId = demoTaskId(i);
  const outbox = createOutbox();
  await db.transaction().execute(async (trx) => {
    // The message first: the checkpoint create() takes then names it as pending work. Enqueued
    // after, the first checkpoint named nothing, and a failover check on a mirror could not tell
    // a planning message published but never mirrored (the task waiting for it forever, not held).
    await outbox.enqueue(
      trx,
      [{ topic: topicOf(run, 'planning'), key: taskId, payload: { task: taskId, stage: 'planning' } }],
      { taskVersion: 1 },
    );
    await store.create({
      task: {
        tenant_id: 'demo',
        task_id: taskId,
        workflow_digest: workflowDigestOf(WORKFLOW_DEFINITION),
        intent_id: `intent-${i}`,
        budget: { currency_committed_usd: 5, currency_spent_usd: 0, tokens_spent: 0, hops_used: 0 },
      },
      actor: 'spiffe://demo.cairn.local/orchestrator',
      trx,
    });
  });
  return taskId;
}
