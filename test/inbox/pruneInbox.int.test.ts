// Inbox pruning cut short (maxBatches, a stopped process) must leave the newest of the old rows:
// the oldest kept row is how far back the failover check trusts the inbox to be complete.
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { pruneInbox } from '../../consumers/sql/pruneInbox.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase('prune_inbox');
});
afterAll(async () => {
  await t?.drop();
});

it('a prune cut short deletes the oldest rows first, whatever order they were written in', async () => {
  // 30 rows applied 1..30 days ago, written in an order unrelated to their age.
  const days = Array.from({ length: 30 }, (_, i) => ((i * 7) % 30) + 1);
  for (const d of days) {
    await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", applied_at)
              VALUES ('g', ${`m-${d}`}, 't', 0, ${d}, now() - make_interval(days => ${d}))`.execute(t.db);
  }
  // 23 rows are past a 7-day retention; two batches of 5 remove 10 of them.
  const removed = await pruneInbox(t.db, { olderThanMs: 7 * 86_400_000, batchSize: 5, maxBatches: 2 });
  expect(removed).toBe(10);
  const { rows } = await sql<{ offset: string }>`SELECT "offset" FROM inbox ORDER BY "offset"`.execute(t.db);
  expect(rows.map((r) => Number(r.offset))).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
});

it("a consumer prunes its own group's rows only: another group's dedupe window is its own retention", async () => {
  for (const group of ['short', 'long']) {
    await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", applied_at)
              VALUES (${group}, ${`${group}-old`}, 't', 0, 0, now() - interval '2 days')`.execute(t.db);
  }
  expect(await pruneInbox(t.db, { olderThanMs: 86_400_000, groupId: 'short' })).toBe(1);
  const { rows } = await sql<{ message_id: string }>`
    SELECT message_id FROM inbox WHERE consumer_group IN ('short', 'long')`.execute(t.db);
  expect(rows.map((r) => r.message_id)).toEqual(['long-old']);
});
