import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';

/** Parks a tenant's key at its head message and records the error on the row. */
export async function parkKey(
  db: Executor,
  p: { tenant: string | null; topic: string; key: string; messageId: string; id: number; error: string },
): Promise<void> {
  await sql`
    WITH parked AS (
      INSERT INTO outbox_parked_key (tenant, topic, key, message_id, error)
      VALUES (${p.tenant ?? ''}, ${p.topic}, ${p.key}, ${p.messageId}::uuid, ${p.error})
      ON CONFLICT (tenant, topic, key) DO NOTHING
    )
    -- A row whose headers break the CHECK (written before it existed) cannot be updated at
    -- all: the park alone holds its key, and the error is on the parked key.
    UPDATE outbox SET attempts = attempts + 1, last_error = ${p.error}
     WHERE id = ${p.id} AND cairn_headers_ok(headers)
  `.execute(db);
}
