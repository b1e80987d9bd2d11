import { type Kysely, sql } from 'kysely';
import { targetSchema } from './schema.js';

/**
 * A receipt's times are the database's, not a tenant's: when a tenant's role (or cairn_app)
 * writes started_at or finished_at, the row gets now() instead (finished_at may be cleared:
 * a receipt taken back for another attempt). Review: a tenant's own INSERT with started_at
 * '-infinity', then moved to gated, sorted first on the console's list of gated receipts,
 * which shows the oldest 100: 101 of them hid every other tenant's gated receipts from the
 * operators; a backdated receipt also looked abandoned (ownerAlive) or long waiting. The
 * library writes only now() (the column's default, reclaim, the outcomes), so nothing it
 * does changes. An owner's session (operators, a failover replay) is not touched.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  const S = await targetSchema(db);
  await sql`
    CREATE FUNCTION cairn_receipt_times() RETURNS trigger LANGUAGE plpgsql
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    BEGIN
      IF NOT ${S}.cairn_is_app_role() THEN
        RETURN NEW;
      END IF;
      IF TG_OP = 'INSERT' THEN
        NEW.started_at := now();
        NEW.finished_at := NULL;
        RETURN NEW;
      END IF;
      IF NEW.started_at IS DISTINCT FROM OLD.started_at THEN
        NEW.started_at := now();
      END IF;
      IF NEW.finished_at IS DISTINCT FROM OLD.finished_at AND NEW.finished_at IS NOT NULL THEN
        NEW.finished_at := now();
      END IF;
      RETURN NEW;
    END
    $fn$;
    CREATE TRIGGER tool_receipt_times BEFORE INSERT OR UPDATE OF started_at, finished_at ON tool_receipt
      FOR EACH ROW EXECUTE FUNCTION cairn_receipt_times();
  `.execute(db);
}
