import { type Kysely, sql } from 'kysely';

/**
 * The inbox tables lose their `cairn_setting_tenant` row triggers (0006, reworked in 0008).
 * Since 0008 only the owner writes them (consumers, replay and operators run as the owner;
 * INSERT is revoked from cairn_app, so from every tenant's role), and the trigger only ever
 * overwrote `tenant_id` with the writer's tenant: for the owner it did nothing, at the price
 * of a plpgsql call and two search_path switches per row. A tenant's role that someone
 * granted INSERT anyway is still bound by row-level security's WITH CHECK
 * (`tenant_id = cairn_current_tenant()`), which refuses a row the trigger would have filled in.
 *
 * Measured (bench/inbox.ts's rows, 500 per transaction, one run, trigger on/off alternating):
 * Postgres CPU per inbox row 19.5 -> 14.8 µs.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    DROP TRIGGER inbox_tenant ON inbox;
    DROP TRIGGER inbox_key_version_tenant ON inbox_key_version;
    DROP TRIGGER inbox_dlq_tenant ON inbox_dlq;
  `.execute(db);
}
