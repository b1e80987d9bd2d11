/**
 * resume() says where each message the checkpoint has in flight is: still in the outbox
 * (queued) or gone from it (published). A message id is unique per tenant only: another
 * tenant's own INSERT may use the same id (review).
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { resume } from '../../src/recovery/resume.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { AGENT } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { resumeOptions, seedPlannedTask } from './fixtures.js';

let tdb: TestDatabase;
let store: TaskStore;
let checkpoints: ReturnType<typeof createCheckpointer>;

beforeAll(async () => {
  tdb = await createTestDatabase('resume_pending');
  checkpoints = createCheckpointer({
    db: tdb.db,
    keyRing: { current: 'k', keys: { k: Buffer.from('key') } },
  });
  store = createTaskStore({ db: tdb.db, checkpointer: checkpoints });
});
afterAll(async () => {
  await tdb?.drop();
});

/** A tenant-a task whose last checkpoint has one message in flight; its id. */
async function taskWithPendingMessage(taskId: string): Promise<string> {
  await seedPlannedTask(store, taskId, 'tenant-a');
  const r = await store.update({
    taskId,
    expectedVersion: 2,
    patch: { artifacts: { code_files: ['src/a.ts'] } },
    actor: AGENT,
    messages: [{ topic: 'cairn.tasks', payload: { step: 'deploying' } }],
    checkpoint: { reason: 'before deploy' },
  });
  if (!r.ok) throw r.error;
  return r.messageIds[0]!;
}

describe('resume: the pending messages', () => {
  it('queued while its row is in the outbox', async () => {
    const id = await taskWithPendingMessage('rp-queued');
    const plan = await resume('rp-queued', resumeOptions({ db: tdb.db, store, checkpoints }));
    expect(plan.pendingMessages).toEqual([{ messageId: id, state: 'queued' }]);
  });

  it("published once its row is gone, whatever another tenant's row under the same id", async () => {
    const id = await taskWithPendingMessage('rp-published');
    // The relay sent it; tenant B's own SQL writes a row under its id.
    await tdb.db.deleteFrom('outbox').where('message_id', '=', id).execute();
    await sql`INSERT INTO outbox (lane, message_id, tenant_id, topic, key, payload)
              VALUES (0, ${id}::uuid, 'tenant-b', 'cairn.tasks', 'b', '\\x00')`.execute(tdb.db);
    const plan = await resume('rp-published', resumeOptions({ db: tdb.db, store, checkpoints }));
    // Observed before: 'queued' (the owner's query read every tenant's rows).
    expect(plan.pendingMessages).toEqual([{ messageId: id, state: 'published' }]);
  });

  it("queued while an untagged row keyed by the task (the owner's, in the checkpoint's pending work) is there", async () => {
    await seedPlannedTask(store, 'rp-untagged', 'tenant-a');
    const [untagged] = await tdb.db
      .transaction()
      .execute((t) =>
        createOutbox().enqueue(t, [{ topic: 'cairn.tasks', key: 'rp-untagged', payload: { x: 1 } }]),
      );
    const r = await store.update({
      taskId: 'rp-untagged',
      expectedVersion: 2,
      patch: { artifacts: { code_files: ['src/a.ts'] } },
      actor: AGENT,
      checkpoint: { reason: 'before deploy' },
    });
    if (!r.ok) throw r.error;
    const plan = await resume('rp-untagged', resumeOptions({ db: tdb.db, store, checkpoints }));
    // Observed with the tenant's rows only (review): 'published'.
    expect(plan.pendingMessages).toEqual([{ messageId: untagged, state: 'queued' }]);
  });
});
