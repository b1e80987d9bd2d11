import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { skipMessage } from '../../src/outbox/operator.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { listPlantedRows, outboxStatus, plantedRows } from '../../src/outbox/status.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

// Migration 0012 refuses outbox rows the library never writes (a lane past 31, an id past 2^53)
// and tenants' explicit ids, but NOT VALID: rows a tenant's own SQL planted before it stay. An
// operator sees how many in `cairn outbox status` and removes them with `cairn outbox skip`.

let tdb: TestDatabase;
beforeAll(async () => {
  tdb = await createTestDatabase('planted_rows');
});
afterAll(async () => {
  await tdb?.drop();
});

describe('outbox rows planted before migration 0012', () => {
  it('are counted by outbox status, apart from the backlog the library wrote, until an operator skips them', async () => {
    await tdb.db
      .transaction()
      .execute((t) => createOutbox().enqueue(t, [{ topic: 't', key: 'k', payload: { n: 1 } }]));
    // What a tenant could insert before 0012: the constraints are taken away for the plant only.
    await sql`ALTER TABLE outbox DROP CONSTRAINT outbox_id_safe, DROP CONSTRAINT outbox_lane_known`.execute(
      tdb.db,
    );
    const planted = [randomUUID(), randomUUID(), randomUUID()]; // a lane past 31, an id past 2^53, an id ahead
    await sql`
      INSERT INTO outbox (id, lane, message_id, topic, key, headers, payload) VALUES
        (DEFAULT, 40, ${planted[0]}, 't', 'k', '{}', '\\x00'),
        (9007199254740993, 1, ${planted[1]}, 't', 'k', '{}', '\\x00'),
        (nextval(pg_get_serial_sequence('outbox', 'id')) + 1000, 1, ${planted[2]}, 't', 'k', '{}', '\\x00')
    `.execute(tdb.db);
    await sql`
      ALTER TABLE outbox ADD CONSTRAINT outbox_id_safe CHECK (id BETWEEN 1 AND 9007199254740991) NOT VALID;
      ALTER TABLE outbox ADD CONSTRAINT outbox_lane_known CHECK (lane < 32) NOT VALID;
    `.execute(tdb.db);

    expect(await outboxStatus(tdb.db)).toMatchObject({ backlog: 4, planted_rows: 3 });
    expect((await listPlantedRows(tdb.db, 20)).map((r) => r.message_id).sort()).toEqual([...planted].sort());
    for (const messageId of planted)
      await skipMessage(tdb.db, { messageId, actor: 'spiffe://ops/alice', reason: 'planted before 0012' });
    expect(await outboxStatus(tdb.db)).toMatchObject({ backlog: 1, planted_rows: 0 });
  });

  it('are found through index ranges, not a scan per row of the backlog (a metrics scrape waits for it)', async () => {
    await sql`
      INSERT INTO outbox (lane, message_id, topic, key, headers, payload)
      SELECT g % 32, gen_random_uuid(), 't', 'k' || g, '{}', '\\x00' FROM generate_series(1, 50000) AS g
    `.execute(tdb.db);
    await sql`ANALYZE outbox`.execute(tdb.db);
    const { rows } = await sql<{
      'QUERY PLAN': unknown;
    }>`EXPLAIN (FORMAT JSON) ${await plantedRows(tdb.db)}`.execute(tdb.db);
    const plan = JSON.stringify(rows[0]);
    expect(plan).not.toMatch(/"Seq Scan"/);
    expect((await outboxStatus(tdb.db)).planted_rows).toBe(0);
  });

  it('a sequence that does not say where it is (reset with is_called false) flags no row the library wrote', async () => {
    await sql`SELECT setval(pg_get_serial_sequence('outbox', 'id'), (SELECT max(id) + 1 FROM outbox), false)`.execute(
      tdb.db,
    );
    expect((await outboxStatus(tdb.db)).planted_rows).toBe(0);
  });
});
