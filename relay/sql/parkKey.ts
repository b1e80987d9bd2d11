import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';
import { SqlState, sqlState } from '../../src/db/sqlstate.js';

/** Parks a tenant's key at its head message and records the error on the row. */
export async function parkKey(
  db: Executor,
  p: { tenant: string | null; topic: string; key: string; messageId: string; id: number; error: string },
): Promise<void> {
  // Only while the row is still in the outbox (locked, so a concurrent `cairn outbox skip`
  // either waits for the park and removes it, or has removed the row first): a relay that was
  // frozen while it isolated a refused batch must not park a key, on waking, at a message an
  // operator skipped or another relay delivered meanwhile.
  await sql`
    WITH row AS (
      SELECT id FROM outbox WHERE id = ${p.id} FOR KEY SHARE
    )
    INSERT INTO outbox_parked_key (tenant, topic, key, message_id, error)
    SELECT ${p.tenant ?? ''}, ${p.topic}, ${p.key}, ${p.messageId}::uuid, ${p.error} FROM row
    ON CONFLICT (tenant, topic, key) DO NOTHING
  `.execute(db);
  // A row that breaks a CHECK added after it was written (headers, a topic Kafka refuses, a
  // key or headers too large: migrations 0008, 0017) cannot be updated at all: the park alone
  // holds its key, and the error is on the parked key.
  await sql`UPDATE outbox SET attempts = attempts + 1, last_error = ${p.error} WHERE id = ${p.id}`
    .execute(db)
    .catch((err: unknown) => {
      if (sqlState(err) !== SqlState.checkViolation) throw err;
    });
}
