import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { gatesPage } from '../../console/queries.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import type { Db } from '../../src/db/database.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

/**
 * Review (a tenant's own SQL): the humans' page lists the oldest 100 gated receipts. Tenant A's
 * role inserted 101 with started_at '-infinity' and moved them to gated (transitions its role
 * may make): an operator of every tenant saw only tenant A's, and tenant B's receipt, waiting
 * for a human, never showed. A receipt's times are now the database's (migration 0020), and
 * the lists take each tenant in turn.
 */
let t: TestDatabase;
let app: Db;
let asA: Db;
let asB: Db;

beforeAll(async () => {
  t = await createTestDatabase('console_gated_fairness');
  ({ app, asA, asB } = await twoTenants(t, 2));
  for (const [db, tenant, id] of [
    [asA, 'tenant-a', 'a-1'],
    [asB, 'tenant-b', 'b-1'],
  ] as const) {
    await createTaskStore({ db, checkpointer: createCheckpointer({ db }) }).create({
      task: newTask(id, { tenant_id: tenant }),
      actor: AGENT,
    });
  }
});
afterAll(async () => {
  await app?.destroy();
  await t?.drop();
});

/** A gated receipt, as a tenant's role can make one with its own SQL. */
async function gated(db: Db, task: string, key: string, startedAt: string): Promise<void> {
  await sql`INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status, worker, started_at)
            VALUES (gen_random_uuid(), ${key}, ${task}, 's', 'pay', 'd', 'started', 'w', ${startedAt}::timestamptz)`.execute(
    db,
  );
  await sql`UPDATE tool_receipt SET status = 'uncertain', finished_at = '2000-01-01' WHERE idempotency_key = ${key}`.execute(
    db,
  );
  await sql`UPDATE tool_receipt SET status = 'gated' WHERE idempotency_key = ${key}`.execute(db);
}

describe("the console's lists of receipts waiting for a human", () => {
  it("a tenant's role cannot date its receipts: they carry the database's time", async () => {
    await gated(asA, 'a-1', 'a-dated', '-infinity');
    const r = await sql<{ started: boolean; finished: boolean }>`
      SELECT started_at > now() - interval '1 minute' AS started, finished_at > now() - interval '1 minute' AS finished
        FROM tool_receipt WHERE idempotency_key = 'a-dated'`.execute(t.db);
    expect(r.rows).toEqual([{ started: true, finished: true }]);
  });

  it("101 of one tenant's gated receipts, older than another tenant's, do not hide it", async () => {
    for (let i = 0; i < 101; i++) await gated(asA, 'a-1', `a-key-${i}`, '-infinity');
    await gated(asB, 'b-1', 'b-key', 'now');
    const page = await gatesPage({ db: t.db, owner: t.db });
    expect(page.gated).toHaveLength(101); // the page says more wait
    expect(
      page.gated
        .slice(0, 2)
        .map((r) => r.tenant_id)
        .sort(),
    ).toEqual(['tenant-a', 'tenant-b']);
  });
});
