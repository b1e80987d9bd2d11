/**
 * A task held after a failover (task_quarantine) stays as it was held. resume() checked no hold:
 * it marked a dead worker's started receipt uncertain (no trigger guards that update), then
 * failed at the gate's audit row (CN009) with the receipt already changed; with
 * `idempotentTools` it even returned "resumed". It is refused now, before anything is written.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { CairnErrorCodes } from '../../src/errors.js';
import { quarantine, releaseQuarantine } from '../../src/recovery/quarantine.js';
import { resume } from '../../src/recovery/resume.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { resumeOptions, seedPlannedTask } from './fixtures.js';

let t: TestDatabase;
let store: TaskStore;
const checkpoints = () => createCheckpointer({ db: t.db });
beforeAll(async () => {
  t = await createTestDatabase('resume_held');
  store = createTaskStore({ db: t.db, checkpointer: checkpoints() });
});
afterAll(async () => {
  await t?.drop();
});

describe('resume of a held task', () => {
  it('is refused (quarantined) with nothing written: no receipt settled, no audit row, no lease kept; released, it resumes', async () => {
    await seedPlannedTask(store, 'held-1');
    await sql`INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status, worker, started_at)
              VALUES (gen_random_uuid(), 'held-1/deploy', 'held-1', 'deploy', 'deployer', 'sha256:aa', 'started', 'gone',
                      now() - interval '1 hour')`.execute(t.db);
    await quarantine(t.db, ['held-1'], { reason: 'failover: lost work', actor: 'op' });
    const history = await store.history('held-1');
    const options = resumeOptions(
      { db: t.db, store, checkpoints: checkpoints() },
      { idempotentTools: ['deployer'] },
    );

    await expect(resume('held-1', options)).rejects.toMatchObject({
      code: CairnErrorCodes.Quarantined,
      message: expect.stringMatching(/held-1 is held .*failover: lost work.*resume wrote nothing/),
    });
    const receipt = () =>
      t.db
        .selectFrom('tool_receipt')
        .select(['status', 'attempt'])
        .where('task_id', '=', 'held-1')
        .executeTakeFirst();
    expect(await receipt()).toEqual({ status: 'started', attempt: 1 });
    expect(await store.history('held-1')).toEqual(history);
    expect(
      await t.db
        .selectFrom('task_lease')
        .select('holder')
        .where('task_id', '=', 'held-1')
        .where('expires_at', '>', new Date())
        .execute(),
    ).toEqual([]);

    expect(await releaseQuarantine(t.db, 'held-1', 'op')).toBe(1);
    const plan = await resume('held-1', options);
    expect(plan.outcome).toBe('resumed');
    expect(plan.receipts.map((r) => r.action)).toEqual(['retry']);
    expect((await receipt())?.status).toBe('uncertain');
  });
});
