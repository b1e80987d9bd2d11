import { type Kysely, sql } from 'kysely';
import { APP_ROLE } from './0006_tenancy.js';

/**
 * Outbox rows a writer's own SQL could make that no other tenant should pay for (found by the
 * review of the relay's WAL mode):
 * - an id of its choosing: past 2^53 it made the relay's delete of a whole batch fail (the
 *   relay carries ids as JavaScript numbers), so every other row of that batch was sent again;
 *   ahead of the sequence, every other tenant's insert that later drew that id failed (23505).
 *   Tenants' roles now insert the columns the library writes, not `id` (nor `created_at`,
 *   `attempts`, `last_error`); ids stay within 2^53 for everyone;
 * - a lane no relay owns (32 lanes, 0-31): its rows were never published nor deleted.
 * NOT VALID: rows already there are not checked.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  const role = sql.id(APP_ROLE);
  await sql`
    ALTER TABLE outbox ADD CONSTRAINT outbox_id_safe CHECK (id BETWEEN 1 AND 9007199254740991) NOT VALID;
    ALTER TABLE outbox ADD CONSTRAINT outbox_lane_known CHECK (lane < 32) NOT VALID;
    REVOKE INSERT ON outbox FROM ${role};
    GRANT INSERT (lane, message_id, tenant_id, task_id, task_version, task_seq, topic, key, headers, payload)
      ON outbox TO ${role};
  `.execute(db);
}
