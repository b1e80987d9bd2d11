import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { skipMessage } from '../../src/outbox/operator.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { outboxStatus } from '../../src/outbox/status.js';
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
    for (const messageId of planted)
      await skipMessage(tdb.db, { messageId, actor: 'spiffe://ops/alice', reason: 'planted before 0012' });
    expect(await outboxStatus(tdb.db)).toMatchObject({ backlog: 1, planted_rows: 0 });
  });
});
