import { type Kysely, sql } from 'kysely';
import { APP_ROLE } from './0006_tenancy.js';

/**
 * Fencing tokens come from one sequence (invariant 8: a token only grows). Counted per lease
 * row, they started again at 1 when retention deleted a task's lease rows with the task and a
 * task was created again under its id: a worker of the earlier task, paused with token 1, then
 * passed the new holder's fence (review finding, test/leases/tokenAfterRetention). The sequence
 * starts past every token already given; a lease row still takes the greater of its token + 1
 * and the sequence's next value. Tenants' roles may draw from it (USAGE: nextval only): a
 * tenant drawing many makes tokens jump, never fall.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE SEQUENCE lease_token AS bigint MAXVALUE 9007199254740991;
    SELECT setval('lease_token', (SELECT coalesce(max(fencing_token), 0) + 1 FROM task_lease), false);
    GRANT USAGE ON SEQUENCE lease_token TO ${sql.id(APP_ROLE)};
  `.execute(db);
}
