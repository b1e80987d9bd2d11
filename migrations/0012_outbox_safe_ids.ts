import { type Kysely, sql } from 'kysely';

/**
 * Outbox ids stay within 2^53: the relay carries them as JavaScript numbers (claims, fenced
 * deletes, the WAL mode's checks). A writer may choose its own id (`INSERT ... (id, ...)`); one
 * above 2^53 made the relay's delete of its whole batch fail, so every other row of that batch
 * was sent again (found by review). NOT VALID: rows already there are not checked (the
 * sequence never gives such ids).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    ALTER TABLE outbox ADD CONSTRAINT outbox_id_safe CHECK (id BETWEEN 1 AND 9007199254740991) NOT VALID;
  `.execute(db);
}
