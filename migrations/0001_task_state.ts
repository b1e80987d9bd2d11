import { type Kysely, sql } from 'kysely';

/**
 * TaskState and its audit log. The state machine lives in a table so that SQL enforces it
 * too: a trigger refuses an undeclared transition, any change to a terminal task and a
 * version that does not rise by exactly 1, even for a hand-written UPDATE.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE task_status (
      status   text PRIMARY KEY,
      terminal boolean NOT NULL
    );
    INSERT INTO task_status (status, terminal) VALUES
      ('planning', false), ('implementing', false), ('reviewing', false), ('testing', false),
      ('complete', true), ('failed', true), ('cancelled', true), ('expired', true);

    CREATE TABLE task_transition (
      from_status text NOT NULL REFERENCES task_status (status),
      to_status   text NOT NULL REFERENCES task_status (status),
      PRIMARY KEY (from_status, to_status)
    );
    INSERT INTO task_transition (from_status, to_status) VALUES
      ('planning', 'implementing'),
      ('implementing', 'reviewing'), ('implementing', 'planning'),
      ('reviewing', 'testing'), ('reviewing', 'implementing'),
      ('testing', 'complete'), ('testing', 'implementing');
    INSERT INTO task_transition (from_status, to_status)
      SELECT s.status, t.status FROM task_status s CROSS JOIN task_status t
      WHERE NOT s.terminal AND t.status IN ('failed', 'cancelled', 'expired');

    CREATE TABLE task_state (
      task_id        text PRIMARY KEY,
      tenant_id      text NOT NULL,
      version        bigint NOT NULL CHECK (version >= 1),
      schema_version text NOT NULL,
      status         text NOT NULL REFERENCES task_status (status),
      doc            jsonb NOT NULL,
      created_at     timestamptz NOT NULL DEFAULT now(),
      updated_at     timestamptz NOT NULL DEFAULT now(),
      CONSTRAINT task_state_budget_within_commitment CHECK (
        doc->'budget' IS NULL OR
        (doc->'budget'->>'currency_spent_usd')::numeric <= (doc->'budget'->>'currency_committed_usd')::numeric
      )
    );
    CREATE INDEX task_state_tenant_status ON task_state (tenant_id, status);

    CREATE TABLE task_audit (
      task_id      text NOT NULL,
      version      bigint NOT NULL,
      prev_version bigint,
      tenant_id    text NOT NULL,
      actor        text NOT NULL,
      reason       text,
      patch        jsonb NOT NULL,
      at           timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (task_id, version),
      CONSTRAINT task_audit_version_chain CHECK (
        (version = 1 AND prev_version IS NULL) OR prev_version = version - 1
      )
    );

    CREATE FUNCTION task_state_guard() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
      IF (SELECT terminal FROM task_status WHERE status = OLD.status) THEN
        RAISE EXCEPTION 'task % is % (terminal) and can never change again', OLD.task_id, OLD.status
          USING ERRCODE = 'CN001';
      END IF;
      IF NEW.version <> OLD.version + 1 THEN
        RAISE EXCEPTION 'task % version must rise by exactly 1 (from % to %, got %)',
          OLD.task_id, OLD.version, OLD.version + 1, NEW.version USING ERRCODE = 'CN003';
      END IF;
      IF NEW.status <> OLD.status AND NOT EXISTS (
        SELECT 1 FROM task_transition WHERE from_status = OLD.status AND to_status = NEW.status
      ) THEN
        RAISE EXCEPTION 'task % cannot move from % to %: the transition is not declared',
          OLD.task_id, OLD.status, NEW.status USING ERRCODE = 'CN002';
      END IF;
      IF NEW.task_id <> OLD.task_id OR NEW.tenant_id <> OLD.tenant_id THEN
        RAISE EXCEPTION 'task % cannot change its task_id or tenant_id', OLD.task_id USING ERRCODE = 'CN004';
      END IF;
      IF (OLD.doc->'budget') IS NOT NULL AND (NEW.doc->'budget') IS NOT NULL AND
         (NEW.doc->'budget'->>'currency_spent_usd')::numeric < (OLD.doc->'budget'->>'currency_spent_usd')::numeric THEN
        RAISE EXCEPTION 'task % budget.currency_spent_usd cannot decrease (from % to %)', OLD.task_id,
          OLD.doc->'budget'->>'currency_spent_usd', NEW.doc->'budget'->>'currency_spent_usd' USING ERRCODE = 'CN005';
      END IF;
      RETURN NEW;
    END
    $fn$;
    CREATE TRIGGER task_state_guard BEFORE UPDATE ON task_state
      FOR EACH ROW EXECUTE FUNCTION task_state_guard();

    -- The audit log is append-only. Retention (which deletes a task with its history) is the
    -- one exception and says so with SET LOCAL cairn.retention = 'on'.
    CREATE FUNCTION task_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
      IF TG_OP = 'DELETE' AND current_setting('cairn.retention', true) = 'on' THEN
        RETURN OLD;
      END IF;
      RAISE EXCEPTION 'task_audit is append-only: % refused', TG_OP USING ERRCODE = 'CN006';
    END
    $fn$;
    CREATE TRIGGER task_audit_append_only BEFORE UPDATE OR DELETE ON task_audit
      FOR EACH ROW EXECUTE FUNCTION task_audit_append_only();
  `.execute(db);
}
