import { type Kysely, sql } from 'kysely';
import { targetSchema } from './schema.js';

/**
 * Quarantine of tasks that lost work in a regional failover (`cairn failover check --hold`):
 * while a quarantine is active the task's state cannot change and no new tool receipt (so no
 * new side effect) can start for it; an operator decides and releases it. Rows stay as history.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  const S = await targetSchema(db);
  await sql`
    CREATE TABLE task_quarantine (
      task_id     text NOT NULL,
      tenant_id   text,
      reason      text NOT NULL CHECK (length(reason) > 0),
      placed_by   text NOT NULL,
      placed_at   timestamptz NOT NULL DEFAULT now(),
      released_by text,
      released_at timestamptz
    );
    CREATE UNIQUE INDEX task_quarantine_active ON task_quarantine (task_id) WHERE released_at IS NULL;
    CREATE TRIGGER task_quarantine_tenant BEFORE INSERT ON task_quarantine
      FOR EACH ROW EXECUTE FUNCTION cairn_task_tenant();

    CREATE FUNCTION cairn_quarantine_guard() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
      SET search_path = ${S} AS $fn$
    BEGIN
      IF EXISTS (SELECT 1 FROM task_quarantine q WHERE q.task_id = NEW.task_id AND q.released_at IS NULL) THEN
        RAISE EXCEPTION 'task % is quarantined after a failover: % on % refused until an operator releases it (cairn failover release %)',
          NEW.task_id, TG_OP, TG_TABLE_NAME, NEW.task_id USING ERRCODE = 'CN009';
      END IF;
      RETURN NEW;
    END
    $fn$;
    CREATE TRIGGER task_state_quarantine BEFORE UPDATE ON task_state
      FOR EACH ROW EXECUTE FUNCTION cairn_quarantine_guard();
    CREATE TRIGGER tool_receipt_quarantine BEFORE INSERT ON tool_receipt
      FOR EACH ROW EXECUTE FUNCTION cairn_quarantine_guard();

    ALTER TABLE task_quarantine ENABLE ROW LEVEL SECURITY;
    CREATE POLICY tenant_isolation ON task_quarantine
      USING (tenant_id = current_setting('cairn.tenant_id', true))
      WITH CHECK (tenant_id = current_setting('cairn.tenant_id', true));
    GRANT SELECT ON task_quarantine TO cairn_app;
  `.execute(db);
}
