/**
 * After an asynchronous failover the promoted standby may have lost both a lease's acquisition
 * and the token sequence's last values, and give the same fencing token to the next holder. A
 * worker that held that token on the old primary, paused through the failover, then passed
 * the new holder's fence: the fence compared the token only. It compares the lease id too.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LeaseLostError } from '../../src/errors.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase('token_given_twice');
});
afterAll(async () => {
  await t?.drop();
});

describe('a fencing token given out twice (an asynchronous failover lost the first acquisition)', () => {
  it("the earlier holder's writes are refused under the new holder's lease", async () => {
    const store = createTaskStore({ db: t.db });
    const leases = createLeaseManager({ db: t.db });
    await store.create({ task: newTask('T2'), actor: AGENT });
    const w1 = await leases.acquire({ taskId: 'T2', branch: 'main', agentId: 'w1', ttlMs: 600_000 });
    if (!w1.ok) throw new Error('w1 lease');
    // What the promoted standby holds: the lease taken by w2 with the very token w1 had.
    await sql`UPDATE task_lease SET holder = 'w2', lease_id = gen_random_uuid(), acquired_at = now()
               WHERE task_id = 'T2' AND branch = 'main'`.execute(t.db);
    await expect(
      store.update({
        taskId: 'T2',
        expectedVersion: 1,
        patch: { active_agents: ['w1'] },
        actor: AGENT,
        lease: w1,
      }),
    ).rejects.toThrow(LeaseLostError);
    await expect(
      t.db
        .transaction()
        .execute((trx) =>
          createOutbox().enqueue(trx, [{ topic: 'x', key: 'T2', payload: {} }], { lease: w1 }),
        ),
    ).rejects.toThrow(/no longer current/);
    expect((await store.get('T2'))?.version).toBe(1);
  });
});
