/**
 * Migration 0016 started the one sequence fencing tokens come from past every token in
 * task_lease. Those rows are a tenant's to write (UPDATE of fencing_token is granted; only a
 * decrease is refused): a tenant that set its own lease's token near 2^53 before the upgrade
 * put the sequence at its maximum, and every tenant's acquireLease failed from then on.
 * Migration 0017 starts it again past the tokens a lease could have reached by counting, and
 * a token past what JavaScript numbers hold exactly is refused.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Db } from '../../src/db/database.js';
import { migrateToLatest } from '../../src/db/migrate.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
let app: Db;
let asA: Db;
let asB: Db;

beforeAll(async () => {
  t = await createTestDatabase('planted_token', { migrateTo: '0015_tenant_writes' });
  ({ app, asA, asB } = await twoTenants(t, 2));
  // Before the upgrade: tenant A's own task and lease, its token set by its own SQL.
  await createTaskStore({ db: asA }).create({
    task: newTask('a-1', { tenant_id: 'tenant-a' }),
    actor: AGENT,
  });
  await sql`INSERT INTO task_lease (task_id, branch, holder, lease_id, fencing_token, expires_at)
            VALUES ('a-1', 'main', 'w', gen_random_uuid(), 1, now())`.execute(asA);
  await sql`UPDATE task_lease SET fencing_token = 9007199254740990 WHERE task_id = 'a-1'`.execute(asA);
  // And a lease of B's that counted to 41 the old way.
  await createTaskStore({ db: asB }).create({
    task: newTask('b-0', { tenant_id: 'tenant-b' }),
    actor: AGENT,
  });
  await sql`INSERT INTO task_lease (task_id, branch, holder, lease_id, fencing_token, expires_at)
            VALUES ('b-0', 'main', null, null, 41, now())`.execute(asB);
  await migrateToLatest(t.db);
});
afterAll(async () => {
  await app?.destroy();
  await t?.drop();
});

describe("a tenant's planted fencing token and the token sequence", () => {
  it("another tenant's leases are still given, with tokens past every counted one", async () => {
    await createTaskStore({ db: asB }).create({
      task: newTask('b-1', { tenant_id: 'tenant-b' }),
      actor: AGENT,
    });
    const leases = createLeaseManager({ db: asB });
    const got = await leases.acquire({ taskId: 'b-1', branch: 'main', agentId: 'w', ttlMs: 60_000 });
    expect(got.ok).toBe(true);
    if (got.ok) expect(got.fencingToken).toBeGreaterThan(41);
    if (got.ok) expect(got.fencingToken).toBeLessThan(2 ** 40);
    const again = await leases.acquire({ taskId: 'b-0', branch: 'main', agentId: 'w', ttlMs: 60_000 });
    expect(again.ok && again.fencingToken > 41).toBe(true);
  });

  it('a token of its own choosing is refused to a tenant: only what the sequence gave, or its own + 1', async () => {
    const tries = {
      update: await sql`UPDATE task_lease SET fencing_token = 4503599627370496 WHERE task_id = 'b-0'`
        .execute(asB)
        .then(
          (r) => Number(r.numAffectedRows),
          (e: Error) => e.message,
        ),
      insert: await createTaskStore({ db: asB })
        .create({ task: newTask('b-2', { tenant_id: 'tenant-b' }), actor: AGENT })
        .then(() =>
          sql`INSERT INTO task_lease (task_id, branch, holder, lease_id, fencing_token, expires_at)
              VALUES ('b-2', 'main', 'w', gen_random_uuid(), 1000000, now())`.execute(asB),
        )
        .then(
          (r) => Number(r.numAffectedRows),
          (e: Error) => e.message,
        ),
      plusOne: await sql`UPDATE task_lease SET fencing_token = fencing_token + 1 WHERE task_id = 'b-0'`
        .execute(asB)
        .then(
          (r) => Number(r.numAffectedRows),
          (e: Error) => e.message,
        ),
    };
    expect(tries).toEqual({
      update: expect.stringMatching(/was not given by the token sequence/),
      insert: expect.stringMatching(/was not given by the token sequence/),
      plusOne: 1,
    });
  });

  it('a token past 2^53 - 1 is refused', async () => {
    const r = await sql`UPDATE task_lease SET fencing_token = 9007199254740993 WHERE task_id = 'a-1'`
      .execute(asA)
      .then(
        () => 'updated',
        (e: Error) => e.message,
      );
    expect(r).toMatch(/task_lease_token_range|was not given by the token sequence/);
  });
});
