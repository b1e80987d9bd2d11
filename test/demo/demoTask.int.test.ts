import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createDemoTask } from '../../scripts/demo/tasks.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { unmirroredMessages } from '../../src/recovery/failoverMirror.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase('demo_task');
});
afterAll(async () => {
  await db?.drop();
});

it("a demo task's first checkpoint names its planning message: published and never mirrored, the failover check reports it", async () => {
  const store = createTaskStore({ db: db.db, checkpointer: createCheckpointer({ db: db.db }) });
  const taskId = await createDemoTask(db.db, store, 'demotask', 0);
  const [queued] = (
    await sql<{ message_id: string }>`SELECT message_id::text FROM outbox WHERE key = ${taskId}`.execute(
      db.db,
    )
  ).rows;
  const pending = await sql<{ message_id: string }>`
    SELECT w.value->>'message_id' AS message_id
      FROM checkpoint cp CROSS JOIN LATERAL jsonb_array_elements(cp.doc->'pending_work') w
     WHERE cp.task_id = ${taskId} AND cp.state_version = 1`.execute(db.db);
  expect(pending.rows).toEqual([{ message_id: queued!.message_id }]);
  // The relay published it (row gone); the mirror never got it and no inbox has it.
  await sql`DELETE FROM outbox WHERE key = ${taskId}`.execute(db.db);
  expect(await unmirroredMessages(db.db, [], [])).toEqual([
    { taskId, messageId: queued!.message_id, version: 1 },
  ]);
});
