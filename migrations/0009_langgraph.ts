import { type Kysely, sql } from 'kysely';
import { APP_ROLE } from './0006_tenancy.js';
import { targetSchema } from './schema.js';

/** The LangGraph saver's tables (langgraph/): one row-level security policy each. */
export const LANGGRAPH_TABLES = [
  'lg_thread',
  'lg_checkpoint',
  'lg_blob',
  'lg_write',
  'lg_compacted',
  'lg_event',
] as const;

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
 * - `lg_thread` holds one row per thread and namespace, locked by each put: a row lock that
 *   row-level security hides from other tenants (an advisory lock would let any role block
 *   or probe another tenant's thread).
 * - Checkpoint ids compare in the "C" collation (byte order), whatever the database's.
 * - Legal holds (thread id as the held task id) refuse deleting a held thread's checkpoints.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  const S = await targetSchema(db);
  await sql`
    CREATE TABLE lg_thread (
      tenant_id     text NOT NULL,
      thread_id     text NOT NULL,
      checkpoint_ns text NOT NULL,
      created_at    timestamptz NOT NULL DEFAULT now(),
      -- Never written: SELECT ... FOR UPDATE needs UPDATE on some column, and this one means nothing.
      locked_at     timestamptz,
      PRIMARY KEY (tenant_id, thread_id, checkpoint_ns)
    );

    CREATE TABLE lg_checkpoint (
      tenant_id            text NOT NULL,
      thread_id            text NOT NULL,
      checkpoint_ns        text NOT NULL DEFAULT '',
      checkpoint_id        text COLLATE "C" NOT NULL,
      parent_checkpoint_id text COLLATE "C",
      -- The saver instance that wrote it (a random id per CairnSaver): a put that starts a
      -- history on a thread whose head another writer wrote is a fork.
      writer               text NOT NULL,
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
      checkpoint_id text COLLATE "C" NOT NULL,
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
      checkpoint_id text COLLATE "C" NOT NULL,
      digest        text NOT NULL,
      compacted_at  timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (tenant_id, thread_id, checkpoint_ns, checkpoint_id)
    );

    CREATE TABLE lg_event (
      id            bigserial PRIMARY KEY,
      tenant_id     text NOT NULL,
      thread_id     text NOT NULL,
      checkpoint_ns text NOT NULL,
      checkpoint_id text COLLATE "C" NOT NULL,
      event         text NOT NULL CHECK (event IN ('skipped_invalid', 'fork_refused')),
      detail        text NOT NULL,
      at            timestamptz NOT NULL DEFAULT now(),
      UNIQUE (tenant_id, thread_id, checkpoint_ns, checkpoint_id, event)
    );

    -- A checkpoint's channel versions as rows. The planner guesses 100 rows for
    -- jsonb_each_text and then hashes every blob of the thread (reading a head got slower as
    -- the thread grew); ROWS 4 makes it look each one up by key. search_path is pinned, which
    -- also keeps the function from being inlined (and the guess lost).
    CREATE FUNCTION cairn_lg_versions(v jsonb) RETURNS TABLE (channel text, version text)
      LANGUAGE sql IMMUTABLE ROWS 4 SET search_path = pg_catalog, ${S}, pg_temp
      AS $fn$ SELECT key, value FROM jsonb_each_text(v) $fn$;

    -- One put in one round trip (its plans cached by the session): under the thread's row lock,
    -- the head, the parent's digest and a row already under this id are read by statements
    -- that start after the lock is held (each statement of a volatile function takes its own
    -- snapshot), then blobs and checkpoint are inserted. The outcome says why nothing was
    -- written: 'exists' (the same put again), 'conflict_exists', 'parent_digest' (the writer
    -- did not know the parent's digest: it is returned), 'fork', 'id_order', 'blob_conflict'. Measured: 5 round trips and 3 plans per put before, 0.58x LangGraph's own
    -- Postgres saver; see bench/langgraph.ts.
    CREATE FUNCTION cairn_lg_put(
      p_tenant text, p_thread text, p_ns text, p_id text, p_parent text, p_refuse_forks boolean, p_writer text,
      p_prev_digest text, p_checkpoint bytea, p_checkpoint_type text, p_metadata bytea, p_metadata_type text,
      p_versions jsonb, p_metadata_json jsonb, p_blob_digests jsonb, p_boundary boolean,
      p_digest text, p_sig_key text, p_sig text,
      b_channel text[], b_version text[], b_type text[], b_blob bytea[], b_key text[], b_digest text[],
      b_sig_key text[], b_sig text[]
    ) RETURNS TABLE (outcome text, head text, parent_digest text)
      LANGUAGE plpgsql SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    DECLARE
      v_head text;
      v_head_writer text;
      v_parent text;
      v_existing text;
    BEGIN
      -- The thread's row, locked. If deleteThread removed it while this put waited, there is
      -- nothing locked: make the row again and lock that.
      LOOP
        INSERT INTO lg_thread (tenant_id, thread_id, checkpoint_ns) VALUES (p_tenant, p_thread, p_ns)
        ON CONFLICT DO NOTHING;
        PERFORM 1 FROM lg_thread t
          WHERE t.tenant_id = p_tenant AND t.thread_id = p_thread AND t.checkpoint_ns = p_ns FOR UPDATE;
        EXIT WHEN FOUND;
      END LOOP;
      -- The head is the newest checkpoint not recorded as failing verification: a resume that
      -- fell back past a corrupt one continues from the one getTuple returned.
      SELECT c.checkpoint_id, c.writer INTO v_head, v_head_writer FROM lg_checkpoint c
       WHERE c.tenant_id = p_tenant AND c.thread_id = p_thread AND c.checkpoint_ns = p_ns
         AND NOT EXISTS (SELECT 1 FROM lg_event e
                          WHERE e.tenant_id = c.tenant_id AND e.thread_id = c.thread_id
                            AND e.checkpoint_ns = c.checkpoint_ns AND e.checkpoint_id = c.checkpoint_id
                            AND e.event = 'skipped_invalid')
       ORDER BY c.checkpoint_id DESC LIMIT 1;
      SELECT c.digest INTO v_existing FROM lg_checkpoint c
       WHERE c.tenant_id = p_tenant AND c.thread_id = p_thread AND c.checkpoint_ns = p_ns AND c.checkpoint_id = p_id;
      IF p_parent IS NOT NULL THEN
        v_parent := coalesce(
          (SELECT c.digest FROM lg_checkpoint c
            WHERE c.tenant_id = p_tenant AND c.thread_id = p_thread AND c.checkpoint_ns = p_ns AND c.checkpoint_id = p_parent),
          (SELECT z.digest FROM lg_compacted z
            WHERE z.tenant_id = p_tenant AND z.thread_id = p_thread AND z.checkpoint_ns = p_ns AND z.checkpoint_id = p_parent));
      END IF;
      IF v_parent IS DISTINCT FROM p_prev_digest THEN
        RETURN QUERY SELECT 'parent_digest'::text, v_head, v_parent;
        RETURN;
      END IF;
      IF v_existing IS NOT NULL THEN
        RETURN QUERY SELECT CASE WHEN v_existing = p_digest THEN 'exists' ELSE 'conflict_exists' END, v_head, v_parent;
        RETURN;
      END IF;
      -- A put names the checkpoint it continues from. Without one it starts a history, which
      -- is a fork when the thread has a head another writer wrote (a writer that saw the
      -- thread empty, paused, and came back after others ran it).
      IF p_refuse_forks AND (
           (p_parent IS NOT NULL AND v_head IS DISTINCT FROM p_parent)
        OR (p_parent IS NULL AND v_head IS NOT NULL AND v_head_writer IS DISTINCT FROM p_writer)) THEN
        RETURN QUERY SELECT 'fork'::text, v_head, v_parent;
        RETURN;
      END IF;
      IF p_refuse_forks AND v_head IS NOT NULL AND p_id COLLATE "C" <= v_head COLLATE "C" THEN
        RETURN QUERY SELECT 'id_order'::text, v_head, v_parent;
        RETURN;
      END IF;
      -- A value already stored under a (channel, version) this put writes must be the same
      -- value: otherwise the put would report success and its checkpoint never verify.
      IF EXISTS (SELECT 1 FROM unnest(b_channel, b_version, b_digest) u (channel, version, digest)
                   JOIN lg_blob b ON b.tenant_id = p_tenant AND b.thread_id = p_thread AND b.checkpoint_ns = p_ns
                                 AND b.channel = u.channel AND b.version = u.version
                  WHERE b.digest <> u.digest) THEN
        RETURN QUERY SELECT 'blob_conflict'::text, v_head, v_parent;
        RETURN;
      END IF;
      INSERT INTO lg_blob (tenant_id, thread_id, checkpoint_ns, channel, version, type, blob, key_id, digest, sig_key, sig)
      SELECT p_tenant, p_thread, p_ns, u.* FROM unnest(b_channel, b_version, b_type, b_blob, b_key, b_digest, b_sig_key, b_sig) u
      ON CONFLICT DO NOTHING;
      INSERT INTO lg_checkpoint (tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, writer, checkpoint,
                                 checkpoint_type, metadata, metadata_type, versions, metadata_json, blob_digests,
                                 boundary, digest, prev_digest, sig_key, sig)
      VALUES (p_tenant, p_thread, p_ns, p_id, p_parent, p_writer, p_checkpoint, p_checkpoint_type, p_metadata, p_metadata_type,
              p_versions, p_metadata_json, p_blob_digests, p_boundary, p_digest, p_prev_digest, p_sig_key, p_sig);
      RETURN QUERY SELECT 'ok'::text, p_id, v_parent;
    END
    $fn$;

    CREATE FUNCTION cairn_lg_hold_guard() RETURNS trigger LANGUAGE plpgsql
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    BEGIN
      IF OLD.tenant_id <> '' AND ${S}.cairn_is_held(OLD.tenant_id, OLD.thread_id) THEN
        RAISE EXCEPTION 'thread % of tenant % is under legal hold: % refused', OLD.thread_id, OLD.tenant_id, TG_OP
          USING ERRCODE = 'CN008';
      END IF;
      IF TG_OP = 'DELETE' THEN
        RETURN OLD;
      END IF;
      RETURN NEW;
    END
    $fn$;
    -- Held threads: nothing deleted, nothing rewritten, by the saver or by hand.
    CREATE TRIGGER lg_checkpoint_hold BEFORE UPDATE OR DELETE ON lg_checkpoint
      FOR EACH ROW EXECUTE FUNCTION cairn_lg_hold_guard();
    CREATE TRIGGER lg_write_hold BEFORE UPDATE OR DELETE ON lg_write FOR EACH ROW EXECUTE FUNCTION cairn_lg_hold_guard();
    CREATE TRIGGER lg_blob_hold BEFORE UPDATE OR DELETE ON lg_blob FOR EACH ROW EXECUTE FUNCTION cairn_lg_hold_guard();
    CREATE TRIGGER lg_compacted_hold BEFORE UPDATE OR DELETE ON lg_compacted
      FOR EACH ROW EXECUTE FUNCTION cairn_lg_hold_guard();

    -- What the saver skipped or refused, recorded for the caller's own tenant only (tenants
    -- cannot insert into lg_event). Recording again refreshes the row, so a row a tenant
    -- planted cannot mask what the saver saw.
    CREATE FUNCTION cairn_lg_record(p_thread text, p_ns text, p_id text, p_event text, p_detail text)
      RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
      INSERT INTO ${S}.lg_event (tenant_id, thread_id, checkpoint_ns, checkpoint_id, event, detail)
      VALUES (coalesce(${S}.cairn_current_tenant(), ''), p_thread, p_ns, p_id, p_event, left(p_detail, 2000))
      ON CONFLICT (tenant_id, thread_id, checkpoint_ns, checkpoint_id, event)
      DO UPDATE SET detail = EXCLUDED.detail, at = now()
    $fn$;
    REVOKE EXECUTE ON FUNCTION cairn_lg_record(text, text, text, text, text) FROM PUBLIC;
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
    GRANT SELECT, INSERT, DELETE ON lg_thread, lg_checkpoint, lg_blob, lg_compacted TO ${role};
    GRANT UPDATE (locked_at) ON lg_thread TO ${role};
    GRANT UPDATE (boundary) ON lg_checkpoint TO ${role};
    GRANT SELECT, INSERT, DELETE ON lg_write TO ${role};
    -- The special-channel upsert (errors, interrupts) rewrites a write's value, never its place.
    GRANT UPDATE (task_path, channel, type, blob, key_id, digest, sig_key, sig) ON lg_write TO ${role};
    GRANT SELECT ON lg_event TO ${role};
    GRANT EXECUTE ON FUNCTION cairn_lg_record(text, text, text, text, text) TO ${role};
  `.execute(db);
}
