import { type Kysely, sql } from 'kysely';
import { targetSchema } from './schema.js';

/** Tables that hold a tenant's data: every one carries tenant_id and a row-level security policy. */
export const TENANT_TABLES = [
  'task_state',
  'task_audit',
  'outbox',
  'inbox',
  'inbox_key_version',
  'inbox_dlq',
  'task_lease',
  'tool_receipt',
  'checkpoint',
  'checkpoint_snapshot',
  'tenant_key',
  'task_annotation',
  'legal_hold',
  'deletion_certificate',
] as const;

/** The role applications connect as: not the owner of any table, so row-level security applies to it. */
export const APP_ROLE = 'cairn_app';

/**
 * Tenant isolation, encryption keys, retention and legal hold.
 *
 * - tenant_id on every table of tenant data. Rows keyed by a task (leases, receipts,
 *   checkpoints, snapshots) take their task's tenant in a trigger; inbox rows take the
 *   tenant of the message (`cairn-tenant` header) or of the transaction's setting.
 * - Row-level security on each of them: a row is visible and writable only when its
 *   tenant_id equals `current_setting('cairn.tenant_id')`, which the library sets with
 *   SET LOCAL in every transaction of a tenant-scoped connection (src/db/tenant.ts). No
 *   setting: no rows. The owner (migrations, relay, consumers, retention) is not bound.
 * - The role `cairn_app` (LOGIN, no password here: set one in production) owns nothing.
 * - tenant, tenant_key (wrapped data keys), retention_policy, legal_hold, task_annotation
 *   (append-only corrections) and deletion_certificate.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  const S = await targetSchema(db);
  await sql`
    CREATE TABLE tenant (
      tenant_id  text PRIMARY KEY CHECK (tenant_id ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
      created_at timestamptz NOT NULL DEFAULT now()
    );
    INSERT INTO tenant (tenant_id) SELECT DISTINCT tenant_id FROM task_state ON CONFLICT DO NOTHING;

    -- One data key per tenant and generation, wrapped by a key-encryption key (kek_id) of a
    -- KeyProvider. Rotation rewraps (kek_id changes, the data key does not). Shredding deletes
    -- the wrapped key: what it encrypted can never be read again.
    CREATE TABLE tenant_key (
      key_id      text PRIMARY KEY,
      tenant_id   text NOT NULL REFERENCES tenant (tenant_id),
      kek_id      text NOT NULL,
      wrapped_key bytea NOT NULL,
      created_at  timestamptz NOT NULL DEFAULT now(),
      rewrapped_at timestamptz
    );
    CREATE INDEX tenant_key_tenant ON tenant_key (tenant_id, created_at DESC);

    ALTER TABLE checkpoint_snapshot ADD COLUMN key_id text;
    ALTER TABLE tool_receipt ADD COLUMN result_enc bytea, ADD COLUMN result_key_id text;
    ALTER TABLE checkpoint ADD COLUMN data_class text NOT NULL DEFAULT 'internal'
      CHECK (data_class IN ('public', 'internal', 'confidential'));

    ALTER TABLE inbox ADD COLUMN tenant_id text, ADD COLUMN key text;
    ALTER TABLE inbox_key_version ADD COLUMN tenant_id text;
    ALTER TABLE inbox_dlq ADD COLUMN tenant_id text;
    ALTER TABLE task_lease ADD COLUMN tenant_id text;
    ALTER TABLE tool_receipt ADD COLUMN tenant_id text;
    ALTER TABLE checkpoint ADD COLUMN tenant_id text;
    ALTER TABLE checkpoint_snapshot ADD COLUMN tenant_id text;
    CREATE INDEX IF NOT EXISTS inbox_tenant_key ON inbox (tenant_id, key);
    CREATE INDEX IF NOT EXISTS outbox_tenant_key ON outbox (tenant_id, key);
    CREATE INDEX IF NOT EXISTS tool_receipt_task ON tool_receipt (task_id);
    CREATE INDEX IF NOT EXISTS checkpoint_snapshot_task ON checkpoint_snapshot (task_id);

    UPDATE task_lease l SET tenant_id = s.tenant_id FROM task_state s WHERE s.task_id = l.task_id;
    UPDATE tool_receipt r SET tenant_id = s.tenant_id FROM task_state s WHERE s.task_id = r.task_id;
    ALTER TABLE checkpoint DISABLE TRIGGER checkpoint_immutable;
    ALTER TABLE checkpoint_snapshot DISABLE TRIGGER checkpoint_snapshot_immutable;
    UPDATE checkpoint c SET tenant_id = s.tenant_id FROM task_state s WHERE s.task_id = c.task_id;
    UPDATE checkpoint_snapshot c SET tenant_id = s.tenant_id FROM task_state s WHERE s.task_id = c.task_id;
    ALTER TABLE checkpoint ENABLE TRIGGER checkpoint_immutable;
    ALTER TABLE checkpoint_snapshot ENABLE TRIGGER checkpoint_snapshot_immutable;

    -- The owner's lookup of a task's tenant (rows keyed by task take it on insert).
    CREATE FUNCTION cairn_task_tenant() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
      SET search_path = ${S} AS $fn$
    BEGIN
      IF NEW.tenant_id IS NULL THEN
        NEW.tenant_id := coalesce(
          (SELECT tenant_id FROM task_state WHERE task_id = NEW.task_id),
          nullif(current_setting('cairn.tenant_id', true), ''));
      END IF;
      RETURN NEW;
    END
    $fn$;
    CREATE TRIGGER task_lease_tenant BEFORE INSERT ON task_lease FOR EACH ROW EXECUTE FUNCTION cairn_task_tenant();
    CREATE TRIGGER tool_receipt_tenant BEFORE INSERT ON tool_receipt FOR EACH ROW EXECUTE FUNCTION cairn_task_tenant();
    CREATE TRIGGER checkpoint_tenant BEFORE INSERT ON checkpoint FOR EACH ROW EXECUTE FUNCTION cairn_task_tenant();
    CREATE TRIGGER checkpoint_snapshot_tenant BEFORE INSERT ON checkpoint_snapshot
      FOR EACH ROW EXECUTE FUNCTION cairn_task_tenant();

    CREATE FUNCTION cairn_setting_tenant() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
      IF NEW.tenant_id IS NULL THEN
        NEW.tenant_id := nullif(current_setting('cairn.tenant_id', true), '');
      END IF;
      RETURN NEW;
    END
    $fn$;
    CREATE TRIGGER inbox_tenant BEFORE INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION cairn_setting_tenant();
    CREATE TRIGGER inbox_key_version_tenant BEFORE INSERT ON inbox_key_version
      FOR EACH ROW EXECUTE FUNCTION cairn_setting_tenant();
    CREATE TRIGGER inbox_dlq_tenant BEFORE INSERT ON inbox_dlq FOR EACH ROW EXECUTE FUNCTION cairn_setting_tenant();
    CREATE TRIGGER outbox_tenant BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION cairn_setting_tenant();

    CREATE TABLE retention_policy (
      tenant_id   text NOT NULL REFERENCES tenant (tenant_id),
      data_class  text NOT NULL CHECK (data_class IN ('public', 'internal', 'confidential')),
      retain_days numeric NOT NULL CHECK (retain_days >= 0),
      updated_at  timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (tenant_id, data_class)
    );

    -- A hold on one task or on a whole tenant (task_id NULL). Released holds stay as history.
    CREATE TABLE legal_hold (
      hold_id     uuid PRIMARY KEY,
      tenant_id   text NOT NULL REFERENCES tenant (tenant_id),
      task_id     text,
      reason      text NOT NULL CHECK (length(reason) > 0),
      placed_by   text NOT NULL,
      placed_at   timestamptz NOT NULL DEFAULT now(),
      released_by text,
      released_at timestamptz
    );
    CREATE INDEX legal_hold_active ON legal_hold (tenant_id, task_id) WHERE released_at IS NULL;

    CREATE FUNCTION cairn_is_held(p_tenant text, p_task text) RETURNS boolean LANGUAGE sql STABLE
      SECURITY DEFINER SET search_path = ${S} AS $fn$
      SELECT EXISTS (SELECT 1 FROM legal_hold
                      WHERE released_at IS NULL AND tenant_id = p_tenant
                        AND (task_id IS NULL OR task_id = p_task))
    $fn$;

    -- Held data can never be deleted, by retention or by hand.
    CREATE FUNCTION cairn_hold_guard() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
      IF cairn_is_held(OLD.tenant_id, OLD.task_id) THEN
        RAISE EXCEPTION 'task % of tenant % is under legal hold: % refused', OLD.task_id, OLD.tenant_id, TG_OP
          USING ERRCODE = 'CN008';
      END IF;
      RETURN OLD;
    END
    $fn$;
    CREATE TRIGGER task_state_hold BEFORE DELETE ON task_state FOR EACH ROW EXECUTE FUNCTION cairn_hold_guard();
    CREATE TRIGGER task_audit_hold BEFORE DELETE ON task_audit FOR EACH ROW EXECUTE FUNCTION cairn_hold_guard();
    CREATE TRIGGER checkpoint_hold BEFORE DELETE ON checkpoint FOR EACH ROW EXECUTE FUNCTION cairn_hold_guard();
    CREATE TRIGGER tool_receipt_hold BEFORE DELETE ON tool_receipt FOR EACH ROW EXECUTE FUNCTION cairn_hold_guard();

    -- Corrections to (held or not) tasks: append-only; each row names who and why.
    CREATE TABLE task_annotation (
      annotation_id uuid PRIMARY KEY,
      tenant_id     text NOT NULL,
      task_id       text NOT NULL,
      author        text NOT NULL,
      body          text NOT NULL CHECK (length(body) > 0),
      at            timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX task_annotation_task ON task_annotation (task_id);
    CREATE TRIGGER task_annotation_immutable BEFORE UPDATE OR DELETE ON task_annotation
      FOR EACH ROW EXECUTE FUNCTION checkpoint_immutable();
    CREATE TRIGGER task_annotation_hold BEFORE DELETE ON task_annotation
      FOR EACH ROW EXECUTE FUNCTION cairn_hold_guard();

    -- What retention removed, per batch, committed with the deletes.
    CREATE TABLE deletion_certificate (
      certificate_id uuid PRIMARY KEY,
      run_id         uuid NOT NULL,
      tenant_id      text NOT NULL,
      issued_at      timestamptz NOT NULL DEFAULT now(),
      body           jsonb NOT NULL,
      digest         text NOT NULL
    );
    CREATE INDEX deletion_certificate_run ON deletion_certificate (run_id);
    CREATE TRIGGER deletion_certificate_immutable BEFORE UPDATE OR DELETE ON deletion_certificate
      FOR EACH ROW EXECUTE FUNCTION checkpoint_immutable();
  `.execute(db);

  for (const t of TENANT_TABLES) {
    await sql`
      ALTER TABLE ${sql.table(t)} ENABLE ROW LEVEL SECURITY;
      CREATE POLICY tenant_isolation ON ${sql.table(t)}
        USING (tenant_id = current_setting('cairn.tenant_id', true))
        WITH CHECK (tenant_id = current_setting('cairn.tenant_id', true));
    `.execute(db);
  }

  // The role is cluster-wide: create it once (two databases migrating at once may race).
  await sql`
    DO $do$
    BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = ${sql.lit(APP_ROLE)}) THEN
        CREATE ROLE ${sql.id(APP_ROLE)} LOGIN;
      END IF;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END
    $do$;
  `.execute(db);
  const role = sql.id(APP_ROLE);
  await sql`
    GRANT USAGE ON SCHEMA ${S} TO ${role};
    GRANT SELECT ON task_status, task_transition, tenant, retention_policy TO ${role};
    GRANT SELECT, INSERT, UPDATE, DELETE ON task_state, outbox, inbox, inbox_key_version, task_lease TO ${role};
    GRANT SELECT, INSERT ON task_audit, inbox_dlq, checkpoint, checkpoint_snapshot, task_annotation TO ${role};
    GRANT SELECT, INSERT, UPDATE ON tool_receipt TO ${role};
    GRANT SELECT ON tenant_key, legal_hold, deletion_certificate TO ${role};
    GRANT USAGE ON ALL SEQUENCES IN SCHEMA ${S} TO ${role};
  `.execute(db);
}
