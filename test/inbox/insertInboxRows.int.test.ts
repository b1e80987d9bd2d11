import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { insertInboxRows, writtenByThisTransaction } from '../../consumers/sql/insertInboxRows.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

// The inbox's chunk insert after a partial redelivery (some ids applied before, some new): it
// must tell the new ones apart per (tenant, id), and its read-back must cost what the chunk
// holds, not what the group retains. A slow consumer whose partitions were reassigned takes
// this path for every chunk it is sent again.

const GROUP = 'billing';
const RETAINED = 200_000;
let tdb: TestDatabase;

beforeAll(async () => {
  tdb = await createTestDatabase('inbox_rows');
  // What a group keeps between prunes: many applied rows, as the inbox holds them.
  await sql`
    INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", key, tenant_id)
    SELECT ${GROUP}, 'old-' || g, 't', 0, g, 'k', CASE WHEN g % 2 = 0 THEN 'tenant-a' END
      FROM generate_series(1, ${RETAINED}) AS g
  `.execute(tdb.db);
  await sql`ANALYZE inbox`.execute(tdb.db);
});
afterAll(async () => {
  await tdb?.drop();
});

const row = (messageId: string, tenantId?: string) => ({
  messageId,
  tenantId,
  topic: 't',
  partition: 0,
  offset: '1',
  key: 'k',
});

describe('insertInboxRows after a partial redelivery', () => {
  it('returns only the (tenant, id) pairs this chunk inserted: the same id under another tenant is new', async () => {
    const chunk = [
      row('old-2', 'tenant-a'), // applied before, for tenant-a
      row('old-2', 'tenant-b'), // the same id, another tenant: new
      row('old-3'), // applied before, no tenant
      row('old-3', 'tenant-a'), // new for tenant-a
      row('fresh-1'),
      row('fresh-1'), // a second copy within the chunk
    ];
    const fresh = await tdb.db.transaction().execute((trx) => insertInboxRows(trx, GROUP, chunk));
    expect([...fresh].sort()).toEqual(['\u0000fresh-1', 'tenant-a\u0000old-3', 'tenant-b\u0000old-2'].sort());
  });

  it('reads back through the unique index pair by pair: the buffers it touches do not grow with the group', async () => {
    const chunk = [
      ...Array.from({ length: 50 }, (_, i) => row(`old-${2 * i + 2}`, 'tenant-a')),
      ...Array.from({ length: 50 }, (_, i) => row(`later-${i}`, 'tenant-a')),
    ];
    let blocks = 0;
    let inserted = 0;
    await tdb.db.transaction().execute(async (trx) => {
      await insertInboxRows(trx, GROUP, chunk);
      const readBack = writtenByThisTransaction(GROUP, chunk);
      const { rows } = await sql<{
        'QUERY PLAN': unknown;
      }>`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${readBack}`.execute(trx);
      const [{ Plan: plan }] = (rows[0] as { 'QUERY PLAN': unknown })['QUERY PLAN'] as [
        { Plan: Record<string, number> },
      ];
      blocks = (plan['Shared Hit Blocks'] ?? 0) + (plan['Shared Read Blocks'] ?? 0);
      inserted = plan['Actual Rows'] ?? 0;
    });
    expect(inserted).toBe(50);
    // 100 index probes of a 3-level btree and their heap pages: a few hundred blocks at most.
    // Walking the group's 200,000 index entries instead touched 2,000+ (1,137 at 100,000).
    expect(blocks, `buffers the read-back touched with ${RETAINED} rows retained`).toBeLessThan(600);
  });
});
