import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { claimBatch } from '../../relay/sql/claimBatch.js';
import { laneOf } from '../../src/outbox/lanes.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let tdb: TestDatabase;
beforeAll(async () => {
  tdb = await createTestDatabase('claim_batch');
});
afterAll(async () => {
  await tdb.drop();
});

async function insert(key: string, bytes: number): Promise<number> {
  const { rows } = await sql<{ id: number }>`
    INSERT INTO outbox (lane, message_id, topic, key, payload)
    VALUES (${laneOf(key)}, gen_random_uuid(), 'claim', ${key}, ${Buffer.alloc(bytes, 1)})
    RETURNING id`.execute(tdb.db);
  return rows[0]!.id;
}

describe('claimBatch limits', () => {
  it('cuts a claim by payload bytes at a prefix in id order, keeps the first row even when it alone is larger, and says it was cut', async () => {
    await sql`DELETE FROM outbox`.execute(tdb.db);
    const keys = ['a', 'b', 'c'];
    const ids: number[] = [];
    for (let i = 0; i < 12; i++) ids.push(await insert(keys[i % 3]!, 100));
    const lanes = [...new Set(keys.map(laneOf))];

    const all = await claimBatch(tdb.db, { lanes, limit: 100 });
    expect(all.rows.map((r) => r.id)).toEqual(ids);
    expect(all.full).toBe(false);

    // 350 bytes: rows are kept while the bytes before them are under it (0, 100, 200, 300).
    const cut = await claimBatch(tdb.db, { lanes, limit: 100, maxBytes: 350 });
    expect(cut.rows.map((r) => r.id)).toEqual(ids.slice(0, 4));
    expect(cut.full).toBe(true);

    const byCount = await claimBatch(tdb.db, { lanes, limit: 5, maxBytes: 1_000_000 });
    expect(byCount.rows.map((r) => r.id)).toEqual(ids.slice(0, 5));
    expect(byCount.full).toBe(true);

    const big = await claimBatch(tdb.db, { lanes, limit: 100, maxBytes: 10 });
    expect(big.rows.map((r) => r.id)).toEqual(ids.slice(0, 1));
    expect(big.full).toBe(true);

    // In-flight rows are skipped; the cut applies to what is left, still in id order.
    const exclude = all.rows.slice(0, 6).map((r) => ({ id: r.id, lane: r.lane }));
    const next = await claimBatch(tdb.db, { lanes, limit: 100, maxBytes: 250, exclude });
    expect(next.rows.map((r) => r.id)).toEqual(ids.slice(6, 9));
    expect(next.full).toBe(true);
  });
});
