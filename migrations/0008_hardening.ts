import { type Kysely, sql } from 'kysely';
import { TENANT_TABLES } from './0006_tenancy.js';
import { targetSchema } from './schema.js';

/** Every function Cairn's migrations created: their search_path is pinned here (pg_temp last). */
const FUNCTIONS = [
  'task_state_guard()',
  'task_audit_append_only()',
  'checkpoint_immutable()',
  'cairn_task_tenant()',
  'cairn_setting_tenant()',
  'cairn_is_held(text, text)',
  'cairn_hold_guard()',
  'cairn_quarantine_guard()',
];

/** Tables with a tenant_isolation policy (0006 and 0007) that now keys on the login role. */
const POLICY_TABLES = [...TENANT_TABLES, 'task_quarantine'];

/**
 * Hardening against writers who lie: a tenant with its own SQL on its own connection, a slow
 * worker, an operator who repeats a command. See docs/threat-model.md for who can write
 * each table and which test shows a lie breaks nothing.
 *
 * - Tenancy keys on the login role, not on a setting: each tenant has a LOGIN role of its
 *   own (tenant.role_name, member of cairn_app for its grants), and every policy compares
 *   tenant_id with the tenant of `session_user`. A session cannot change its session_user
 *   (SET SESSION AUTHORIZATION needs a superuser; a tenant role is a member of no other
 *   tenant's role), so `set_config('cairn.tenant_id', ...)` no longer means anything.
 * - Rows keyed by a task take the task's tenant and are refused for another tenant's task;
 *   a tenant role cannot key a row to a task that does not exist (a lease or receipt
 *   planted on another tenant's future task id).
 * - Functions pin search_path with pg_temp last: a temporary table named like a guard
 *   table can no longer stand in for it.
 * - A version raised without its audit row is refused at commit.
 * - Receipt status changes follow a transition table; resolving a human gate needs a role
 *   that is not an application role; a new receipt starts as 'started'.
 * - Outbox rows carry the task, version and per-change sequence in columns; the relay sets
 *   every `cairn-*` header from columns, and a row whose headers are not an object of
 *   strings, or name a `cairn-*` header, is refused at insert.
 * - Per-key tables are per tenant: message ids, parked keys, key versions, receipts' keys.
 * - An applied inbox row never turns un-applied (only retention, as the owner, deletes it).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  const S = await targetSchema(db);
  for (const f of FUNCTIONS) {
    await sql`ALTER FUNCTION ${sql.raw(f)} SET search_path = pg_catalog, ${S}, pg_temp`.execute(db);
  }

  await sql`
    -- Tenancy by login role.
    ALTER TABLE tenant ADD COLUMN role_name text UNIQUE;

    CREATE FUNCTION cairn_current_tenant() RETURNS text LANGUAGE sql STABLE SECURITY DEFINER
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
      SELECT tenant_id FROM ${S}.tenant WHERE role_name = session_user
    $fn$;

    -- Registers a tenant and its login role (idempotent; needs CREATEROLE). The role name is
    -- per database, so two Cairn databases on one cluster never share a tenant's role.
    CREATE FUNCTION cairn_register_tenant(p_tenant text) RETURNS text LANGUAGE plpgsql
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    DECLARE
      r text := 'cairn_' || left(md5(current_database()), 6) || '_'
                || left(md5(current_database() || '/' || p_tenant), 8) || '_' || left(p_tenant, 38);
    BEGIN
      -- GRANT rewrites the database's row: two registrations at once would collide on it.
      PERFORM pg_advisory_xact_lock(hashtext('cairn_register_tenant'));
      INSERT INTO ${S}.tenant (tenant_id) VALUES (p_tenant) ON CONFLICT DO NOTHING;
      IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
        BEGIN
          EXECUTE format('CREATE ROLE %I LOGIN IN ROLE cairn_app', r);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
      END IF;
      EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), r);
      UPDATE ${S}.tenant SET role_name = r WHERE tenant_id = p_tenant AND role_name IS DISTINCT FROM r;
      RETURN r;
    END
    $fn$;

    -- Is the writer an application role (cairn_app or a tenant's role), rather than the owner or an operator?
    CREATE FUNCTION cairn_is_app_role() RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
      SELECT session_user::text = 'cairn_app' OR EXISTS (SELECT 1 FROM ${S}.tenant WHERE role_name = session_user)
    $fn$;

    -- Rows keyed by a task take its tenant; another tenant's task, or (for an application
    -- role) a task that does not exist, is refused.
    CREATE OR REPLACE FUNCTION cairn_task_tenant() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    DECLARE
      owner_tenant text;
      writer text := ${S}.cairn_current_tenant();
    BEGIN
      SELECT tenant_id INTO owner_tenant FROM ${S}.task_state WHERE task_id = NEW.task_id;
      IF owner_tenant IS NULL THEN
        IF ${S}.cairn_is_app_role() THEN
          RAISE EXCEPTION 'task % does not exist (or belongs to another tenant): % into % refused',
            NEW.task_id, TG_OP, TG_TABLE_NAME USING ERRCODE = '42501';
        END IF;
        NEW.tenant_id := coalesce(NEW.tenant_id, writer);
        RETURN NEW;
      END IF;
      IF (NEW.tenant_id IS NOT NULL AND NEW.tenant_id <> owner_tenant) OR (writer IS NOT NULL AND writer <> owner_tenant) THEN
        RAISE EXCEPTION 'task % does not exist (or belongs to another tenant): % into % refused',
          NEW.task_id, TG_OP, TG_TABLE_NAME USING ERRCODE = '42501';
      END IF;
      NEW.tenant_id := owner_tenant;
      RETURN NEW;
    END
    $fn$;
    CREATE TRIGGER task_audit_tenant BEFORE INSERT ON task_audit FOR EACH ROW EXECUTE FUNCTION cairn_task_tenant();
    CREATE TRIGGER task_annotation_tenant BEFORE INSERT ON task_annotation
      FOR EACH ROW EXECUTE FUNCTION cairn_task_tenant();

    -- Rows of the consumer side and the outbox: a tenant role writes as itself only.
    CREATE OR REPLACE FUNCTION cairn_setting_tenant() RETURNS trigger LANGUAGE plpgsql
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    DECLARE
      writer text := ${S}.cairn_current_tenant();
    BEGIN
      IF writer IS NOT NULL THEN
        NEW.tenant_id := writer;
      END IF;
      RETURN NEW;
    END
    $fn$;

    -- A version is never raised without its audit row (checked at commit: the CAS writes both in one statement).
    CREATE FUNCTION cairn_version_audited() RETURNS trigger LANGUAGE plpgsql
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    BEGIN
      IF NOT EXISTS (SELECT 1 FROM ${S}.task_audit a WHERE a.task_id = NEW.task_id AND a.version = NEW.version) THEN
        RAISE EXCEPTION 'task % is at version % without an audit row for it: refused', NEW.task_id, NEW.version
          USING ERRCODE = 'CN003';
      END IF;
      RETURN NULL;
    END
    $fn$;
    CREATE CONSTRAINT TRIGGER task_state_version_audited AFTER UPDATE ON task_state
      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cairn_version_audited();

    -- Receipts: every status change is a declared transition.
    ALTER TABLE tool_receipt DROP CONSTRAINT tool_receipt_status_check;
    ALTER TABLE tool_receipt ADD CONSTRAINT tool_receipt_status_check CHECK (status IN
      ('started', 'succeeded', 'failed', 'uncertain', 'compensating', 'compensated', 'gated'));
    CREATE TABLE receipt_transition (
      from_status text NOT NULL,
      to_status   text NOT NULL,
      operator_only boolean NOT NULL DEFAULT false,
      PRIMARY KEY (from_status, to_status)
    );
    INSERT INTO receipt_transition (from_status, to_status, operator_only) VALUES
      ('started', 'succeeded', false), ('started', 'failed', false), ('started', 'uncertain', false),
      ('failed', 'started', false),
      ('uncertain', 'started', false), ('uncertain', 'succeeded', false),
      ('uncertain', 'compensating', false), ('uncertain', 'gated', false),
      ('compensating', 'compensated', false), ('compensating', 'gated', false),
      ('compensating', 'uncertain', false),
      ('compensated', 'gated', false),
      ('gated', 'succeeded', true), ('gated', 'failed', true), ('gated', 'compensated', true);

    CREATE FUNCTION cairn_receipt_guard() RETURNS trigger LANGUAGE plpgsql
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    DECLARE
      t ${S}.receipt_transition;
    BEGIN
      IF TG_OP = 'INSERT' THEN
        IF NEW.status <> 'started' THEN
          RAISE EXCEPTION 'a new receipt starts as started, not %', NEW.status USING ERRCODE = 'CN010';
        END IF;
        RETURN NEW;
      END IF;
      IF NEW.receipt_id <> OLD.receipt_id OR NEW.idempotency_key <> OLD.idempotency_key
         OR NEW.task_id <> OLD.task_id OR NEW.tenant_id IS DISTINCT FROM OLD.tenant_id THEN
        RAISE EXCEPTION 'receipt %: its id, key, task and tenant never change', OLD.receipt_id USING ERRCODE = 'CN010';
      END IF;
      IF NEW.status = OLD.status THEN
        RETURN NEW;
      END IF;
      SELECT * INTO t FROM ${S}.receipt_transition WHERE from_status = OLD.status AND to_status = NEW.status;
      IF NOT FOUND THEN
        RAISE EXCEPTION 'receipt % cannot move from % to %', OLD.receipt_id, OLD.status, NEW.status
          USING ERRCODE = 'CN010';
      END IF;
      IF t.operator_only AND ${S}.cairn_is_app_role() THEN
        RAISE EXCEPTION 'receipt % is gated: only an operator resolves it (% -> % refused for %)',
          OLD.receipt_id, OLD.status, NEW.status, session_user USING ERRCODE = '42501';
      END IF;
      RETURN NEW;
    END
    $fn$;
    CREATE TRIGGER tool_receipt_guard BEFORE INSERT OR UPDATE ON tool_receipt
      FOR EACH ROW EXECUTE FUNCTION cairn_receipt_guard();
    ALTER TABLE tool_receipt DROP CONSTRAINT tool_receipt_idempotency_key_key;
    CREATE UNIQUE INDEX tool_receipt_tenant_key ON tool_receipt ((coalesce(tenant_id, '')), idempotency_key);

    -- Outbox: Cairn's headers come from columns.
    CREATE FUNCTION cairn_headers_ok(h jsonb) RETURNS boolean LANGUAGE sql IMMUTABLE
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
      SELECT jsonb_typeof(h) = 'object' AND NOT EXISTS (
        SELECT 1 FROM jsonb_each(h) e WHERE jsonb_typeof(e.value) <> 'string' OR lower(e.key) LIKE 'cairn-%')
    $fn$;
    ALTER TABLE outbox ADD COLUMN task_id text, ADD COLUMN task_version bigint, ADD COLUMN task_seq integer;
    UPDATE outbox SET task_version = (headers->>'cairn-task-version')::bigint, task_id = key, task_seq = 0
     WHERE headers->>'cairn-task-version' ~ '^[0-9]{1,18}$';
    UPDATE outbox SET headers = (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}')
                                   FROM jsonb_each(headers) e WHERE lower(e.key) NOT LIKE 'cairn-%')
     WHERE jsonb_typeof(headers) = 'object';
    ALTER TABLE outbox ADD CONSTRAINT outbox_headers_ok CHECK (cairn_headers_ok(headers)) NOT VALID;
    ALTER TABLE outbox DROP CONSTRAINT outbox_message_id_key;
    CREATE UNIQUE INDEX outbox_tenant_message ON outbox ((coalesce(tenant_id, '')), message_id);
    CREATE INDEX outbox_message_id ON outbox (message_id);
    CREATE INDEX outbox_task ON outbox (task_id) WHERE task_id IS NOT NULL;

    CREATE FUNCTION cairn_outbox_task() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    BEGIN
      IF NEW.task_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM ${S}.task_state s WHERE s.task_id = NEW.task_id AND s.tenant_id IS NOT DISTINCT FROM NEW.tenant_id
      ) THEN
        RAISE EXCEPTION 'outbox message %: task % does not exist (or belongs to another tenant)',
          NEW.message_id, NEW.task_id USING ERRCODE = '42501';
      END IF;
      RETURN NEW;
    END
    $fn$;
    -- Named to fire after outbox_tenant (triggers fire in name order).
    CREATE TRIGGER outbox_zz_task BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION cairn_outbox_task();

    ALTER TABLE outbox_parked_key ADD COLUMN tenant text NOT NULL DEFAULT '';
    ALTER TABLE outbox_parked_key DROP CONSTRAINT outbox_parked_key_pkey;
    ALTER TABLE outbox_parked_key ADD PRIMARY KEY (tenant, topic, key);
    ALTER TABLE outbox_operator_audit ADD COLUMN tenant text;

    -- Inbox: per tenant, and applied for good.
    ALTER TABLE inbox DROP CONSTRAINT inbox_pkey;
    CREATE UNIQUE INDEX inbox_group_tenant_message ON inbox (consumer_group, (coalesce(tenant_id, '')), message_id);
    ALTER TABLE inbox_dlq DROP CONSTRAINT inbox_dlq_consumer_group_message_id_key;
    CREATE UNIQUE INDEX inbox_dlq_group_tenant_message ON inbox_dlq (consumer_group, (coalesce(tenant_id, '')), message_id);
    ALTER TABLE inbox_key_version ADD COLUMN seq integer NOT NULL DEFAULT 0;
    ALTER TABLE inbox_key_version DROP CONSTRAINT inbox_key_version_pkey;
    CREATE UNIQUE INDEX inbox_key_version_group_tenant_key ON inbox_key_version (consumer_group, (coalesce(tenant_id, '')), key);

    CREATE FUNCTION cairn_inbox_applied_guard() RETURNS trigger LANGUAGE plpgsql
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    BEGIN
      IF OLD.outcome <> 'applied' THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
      END IF;
      IF TG_OP = 'DELETE' THEN
        IF current_setting('cairn.retention', true) = 'on' AND NOT ${S}.cairn_is_app_role() THEN
          RETURN OLD;
        END IF;
      ELSIF NEW.outcome = 'applied' OR OLD.xmin = pg_current_xact_id()::xid THEN
        -- Still applied, or marked stale by the transaction that is recording it.
        RETURN NEW;
      END IF;
      RAISE EXCEPTION 'inbox: message % was applied by group %; an applied message never becomes un-applied (% refused)',
        OLD.message_id, OLD.consumer_group, TG_OP USING ERRCODE = 'CN011';
    END
    $fn$;
    CREATE TRIGGER inbox_applied_guard BEFORE UPDATE OR DELETE ON inbox
      FOR EACH ROW EXECUTE FUNCTION cairn_inbox_applied_guard();
  `.execute(db);

  for (const t of POLICY_TABLES) {
    await sql`
      DROP POLICY tenant_isolation ON ${sql.table(t)};
      CREATE POLICY tenant_isolation ON ${sql.table(t)}
        USING (tenant_id = (SELECT cairn_current_tenant()))
        WITH CHECK (tenant_id = (SELECT cairn_current_tenant()));
    `.execute(db);
  }

  await sql`
    -- What an application role may write is what the library writes for a tenant, nothing
    -- more; the triggers above guard inserts, and these grants keep updates from moving a
    -- row to another tenant's task (found by review: a lease or an outbox row re-pointed).
    -- Consumers, the relay, retention and operators run as the owner.
    REVOKE INSERT, UPDATE, DELETE ON inbox, inbox_key_version, inbox_dlq FROM cairn_app;
    REVOKE UPDATE ON outbox, task_lease, tool_receipt FROM cairn_app;
    GRANT UPDATE (holder, lease_id, fencing_token, acquired_at, expires_at) ON task_lease TO cairn_app;
    GRANT UPDATE (status, attempt, worker, lease_task_id, lease_branch, lease_id, fencing_token, result,
                  result_digest, result_enc, result_key_id, error, resolution, started_at, finished_at)
      ON tool_receipt TO cairn_app;
    -- The tenant list (and role names) is the owner's: a tenant learns its own through functions.
    REVOKE SELECT ON tenant FROM cairn_app;
    GRANT SELECT ON receipt_transition TO cairn_app;

    CREATE FUNCTION cairn_tenant_role(p_tenant text) RETURNS text LANGUAGE sql STABLE SECURITY DEFINER
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
      SELECT role_name FROM ${S}.tenant WHERE tenant_id = p_tenant
    $fn$;

    -- A lease keeps its task and tenant, and its fencing token never goes down.
    CREATE FUNCTION cairn_lease_guard() RETURNS trigger LANGUAGE plpgsql
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    BEGIN
      IF NEW.task_id <> OLD.task_id OR NEW.branch <> OLD.branch OR NEW.tenant_id IS DISTINCT FROM OLD.tenant_id THEN
        RAISE EXCEPTION 'lease %/%: its task, branch and tenant never change', OLD.task_id, OLD.branch
          USING ERRCODE = 'CN010';
      END IF;
      IF NEW.fencing_token < OLD.fencing_token THEN
        RAISE EXCEPTION 'lease %/%: the fencing token only grows (% -> % refused)', OLD.task_id, OLD.branch,
          OLD.fencing_token, NEW.fencing_token USING ERRCODE = 'CN010';
      END IF;
      RETURN NEW;
    END
    $fn$;
    CREATE TRIGGER task_lease_guard BEFORE UPDATE ON task_lease FOR EACH ROW EXECUTE FUNCTION cairn_lease_guard();

    -- The document's identity is the row's.
    ALTER TABLE task_state ADD CONSTRAINT task_state_doc_identity CHECK (
      doc->>'task_id' = task_id AND (doc->>'tenant_id' IS NULL OR doc->>'tenant_id' = tenant_id)) NOT VALID;

    -- A tenant asks about holds on its own tasks only.
    CREATE OR REPLACE FUNCTION cairn_is_held(p_tenant text, p_task text) RETURNS boolean LANGUAGE sql STABLE
      SECURITY DEFINER SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
      SELECT (NOT ${S}.cairn_is_app_role() OR p_tenant = ${S}.cairn_current_tenant())
         AND EXISTS (SELECT 1 FROM ${S}.legal_hold
                      WHERE released_at IS NULL AND tenant_id = p_tenant
                        AND (task_id IS NULL OR task_id = p_task))
    $fn$;
  `.execute(db);
  // Tenants registered before this migration get their role now.
  await sql`SELECT cairn_register_tenant(tenant_id) FROM tenant`.execute(db);
}
