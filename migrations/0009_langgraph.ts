import { type Kysely, sql } from 'kysely';
import { APP_ROLE } from './0006_tenancy.js';
import { targetSchema } from './schema.js';

/** The LangGraph saver's tables (langgraph/): one row-level security policy each. */
export const LANGGRAPH_TABLES = ['lg_checkpoint', 'lg_blob', 'lg_write', 'lg_compacted', 'lg_event'] as const;

/**
 * Tables of the LangGraph checkpoint saver (`@cairn-state/cairn/langgraph`).
 *
 * The layout is LangGraph's own (a checkpoint row without its channel values, one blob per
 * channel and version, pending writes per task), so `list` filters and pending sends work as
 * LangGraph expects. What Cairn adds:
 * - `tenant_id` in every key (a thread id is the tenant's own name; '' when no tenant acts),
 *   and a policy binding each row to the tenant of the login role (src/db/tenant.ts), so a
 *   tenant's own SQL cannot read or write another tenant's threads.
 * - A digest on every row (and an HMAC with a key ring) that binds its bytes to its tenant,
 *   thread, namespace and place; `prev_digest` chains a checkpoint to its parent.
 * - Checkpoints and blobs are never updated (no UPDATE grant but `boundary`); a tenant that
 *   edits its own rows by SQL is caught by the digests, not prevented.
 * - `lg_compacted` keeps the digest of a step compaction removed (the chain still checks);
 *   `lg_event` records a checkpoint skipped as corrupt or a fork refused.
 * - Legal holds (thread id as the held task id) refuse deleting a held thread's checkpoints.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  const S = await targetSchema(db);
  await sql`
    CREATE TABLE lg_checkpoint (
      tenant_id            text NOT NULL,
      thread_id            text NOT NULL,
      checkpoint_ns        text NOT NULL DEFAULT '',
      checkpoint_id        text NOT NULL,
      parent_checkpoint_id text,
      -- The serializer's bytes of the checkpoint without channel values, and of the metadata:
      -- the digest covers these exact bytes. versions and metadata_json are copies for SQL
      -- (the blob join, list filters); what is returned is always decoded from the bytes.
      checkpoint           bytea NOT NULL,
      checkpoint_type      text NOT NULL,
      metadata             bytea NOT NULL,
      metadata_type        text NOT NULL,
      versions             jsonb NOT NULL,
      metadata_json        jsonb NOT NULL,
      -- The digests of the blobs this put wrote ({channel: [version, digest]}), inside the
      -- checkpoint's own digest: a value of its own that is missing or replaced is caught.
      blob_digests         jsonb NOT NULL,
      boundary             boolean NOT NULL DEFAULT false,
      digest               text NOT NULL,
      prev_digest          text,
      sig_key              text,
      sig                  text,
      created_at           timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (tenant_id, thread_id, checkpoint_ns, checkpoint_id)
    );
    CREATE INDEX lg_checkpoint_metadata ON lg_checkpoint USING gin (metadata_json jsonb_path_ops);

    CREATE TABLE lg_blob (
      tenant_id     text NOT NULL,
      thread_id     text NOT NULL,
      checkpoint_ns text NOT NULL DEFAULT '',
      channel       text NOT NULL,
      version       text NOT NULL,
      type          text NOT NULL,
      blob          bytea,
      key_id        text,
      digest        text NOT NULL,
      sig_key       text,
      sig           text,
      PRIMARY KEY (tenant_id, thread_id, checkpoint_ns, channel, version)
    );

    CREATE TABLE lg_write (
      tenant_id     text NOT NULL,
      thread_id     text NOT NULL,
      checkpoint_ns text NOT NULL DEFAULT '',
      checkpoint_id text NOT NULL,
      task_id       text NOT NULL,
      idx           integer NOT NULL,
      task_path     text NOT NULL DEFAULT '',
      channel       text NOT NULL,
      type          text NOT NULL,
      blob          bytea NOT NULL,
      key_id        text,
      digest        text NOT NULL,
      sig_key       text,
      sig           text,
      PRIMARY KEY (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
    );

    CREATE TABLE lg_compacted (
      tenant_id     text NOT NULL,
      thread_id     text NOT NULL,
      checkpoint_ns text NOT NULL,
      checkpoint_id text NOT NULL,
      digest        text NOT NULL,
      compacted_at  timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (tenant_id, thread_id, checkpoint_ns, checkpoint_id)
    );

    CREATE TABLE lg_event (
      id            bigserial PRIMARY KEY,
      tenant_id     text NOT NULL,
      thread_id     text NOT NULL,
      checkpoint_ns text NOT NULL,
      checkpoint_id text NOT NULL,
      event         text NOT NULL CHECK (event IN ('skipped_invalid', 'fork_refused')),
      detail        text NOT NULL,
      at            timestamptz NOT NULL DEFAULT now(),
      UNIQUE (tenant_id, thread_id, checkpoint_ns, checkpoint_id, event)
    );

    CREATE FUNCTION cairn_lg_hold_guard() RETURNS trigger LANGUAGE plpgsql
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    BEGIN
      IF OLD.tenant_id <> '' AND ${S}.cairn_is_held(OLD.tenant_id, OLD.thread_id) THEN
        RAISE EXCEPTION 'thread % of tenant % is under legal hold: % refused', OLD.thread_id, OLD.tenant_id, TG_OP
          USING ERRCODE = 'CN008';
      END IF;
      RETURN OLD;
    END
    $fn$;
    CREATE TRIGGER lg_checkpoint_hold BEFORE DELETE ON lg_checkpoint FOR EACH ROW EXECUTE FUNCTION cairn_lg_hold_guard();
    CREATE TRIGGER lg_write_hold BEFORE DELETE ON lg_write FOR EACH ROW EXECUTE FUNCTION cairn_lg_hold_guard();
    CREATE TRIGGER lg_blob_hold BEFORE DELETE ON lg_blob FOR EACH ROW EXECUTE FUNCTION cairn_lg_hold_guard();
  `.execute(db);

  for (const t of LANGGRAPH_TABLES) {
    // '' is the space of callers acting for no tenant (the owner, cairn_app): a tenant's role
    // sees its own rows only, and cairn_app sees no tenant's.
    await sql`
      ALTER TABLE ${sql.table(t)} ENABLE ROW LEVEL SECURITY;
      CREATE POLICY tenant_isolation ON ${sql.table(t)}
        USING (tenant_id = coalesce((SELECT cairn_current_tenant()), ''))
        WITH CHECK (tenant_id = coalesce((SELECT cairn_current_tenant()), ''));
    `.execute(db);
  }
  const role = sql.id(APP_ROLE);
  await sql`
    GRANT SELECT, INSERT, DELETE ON lg_checkpoint, lg_blob, lg_compacted TO ${role};
    GRANT UPDATE (boundary) ON lg_checkpoint TO ${role};
    GRANT SELECT, INSERT, UPDATE, DELETE ON lg_write TO ${role};
    GRANT SELECT, INSERT ON lg_event TO ${role};
    GRANT USAGE ON SEQUENCE lg_event_id_seq TO ${role};
  `.execute(db);
}
