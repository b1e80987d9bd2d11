import { type Kysely, sql } from 'kysely';
import { targetSchema } from './schema.js';

/**
 * The head cairn_lg_put continues from ignores two kinds of skipped_invalid mark that earlier
 * releases recorded for rows that were not corrupt (invariant 13: a reader's limitation or an
 * outage is never taken for corruption):
 * - `does not decode: ...`: the checkpoint's digest and signature verified, and the reading
 *   saver's serializer (an older release's) could not decode it;
 * - `... does not decrypt: data key ...`: the tenant's data key did not unwrap (a keyring with
 *   another key-encryption key), so the row itself was never checked.
 * Marked, such a checkpoint was no head for good: getTuple returned it once the reader could
 * read it, and a put continuing from it was refused as a fork. Releases from this one throw
 * instead of recording either (langgraph/rowCodec.ts, src/crypto/tenantKeys.ts); the detail is
 * matched, not deleted, so a release before this one still running against the database (the
 * older reader itself) cannot stick a thread either, and `events()` still shows what it saw.
 * A tenant can record any detail for its own threads (cairn_lg_record), so it gains nothing:
 * a mark it could write it could also leave out. A row marked this way that is corrupt after
 * all is marked again, with what is wrong, by the next read that falls back past it.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  const S = await targetSchema(db);
  await sql`
    CREATE OR REPLACE FUNCTION cairn_lg_put(
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
      -- fell back past a corrupt one continues from the one getTuple returned. Marks that say
      -- only that the reader could not read the row (migration 0018) are not corruption.
      SELECT c.checkpoint_id, c.writer INTO v_head, v_head_writer FROM lg_checkpoint c
       WHERE c.tenant_id = p_tenant AND c.thread_id = p_thread AND c.checkpoint_ns = p_ns
         AND NOT EXISTS (SELECT 1 FROM lg_event e
                          WHERE e.tenant_id = c.tenant_id AND e.thread_id = c.thread_id
                            AND e.checkpoint_ns = c.checkpoint_ns AND e.checkpoint_id = c.checkpoint_id
                            AND e.event = 'skipped_invalid'
                            AND e.detail NOT LIKE 'does not decode:%'
                            AND e.detail NOT LIKE '% does not decrypt: data key %')
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
  `.execute(db);
}
