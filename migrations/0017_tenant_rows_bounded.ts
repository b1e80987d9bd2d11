import { type Kysely, sql } from 'kysely';
import { targetSchema } from './schema.js';

/** 2^52: no lease counted one acquisition at a time gets near it; the tokens above it were written by hand. */
const COUNTED = '4503599627370496';

/**
 * What a tenant's own rows could still do to others, or to the record (review of session 12):
 * - Fencing tokens: 0016 started the token sequence past the largest token in task_lease,
 *   whose rows are the tenants' to write. A tenant that had set its own lease's token near
 *   2^53 put the sequence at its maximum, and every acquireLease of every tenant failed
 *   (test/leases/plantedToken). The sequence starts again past the tokens leases could have
 *   reached by counting (below 2^52): a lease row still takes the greater of its own token + 1
 *   and the sequence, so a task whose token was set higher by hand only keeps its own, and a
 *   token past what a JavaScript number holds exactly (2^53 - 1) is refused from now on. A
 *   tenant's role no longer writes a token of its choosing: only the one the sequence just gave
 *   its session, or its row's own + 1 (what acquireLease writes).
 * - Settled receipts: 0015 froze what a succeeded or compensated receipt records, but not the
 *   lease it ran under (fencing token, lease id, task and branch), shown to operators as
 *   evidence; and moving one to gated (compensated -> gated, a late success) rewrote any column
 *   on the way. Now nothing of a settled receipt changes for a tenant's role, its move to gated
 *   included, and of a gated one (waiting for a human, who reads it to decide) only its
 *   resolution may grow: the library adds what a late attempt reported, and nothing already
 *   written is rewritten (test/tenancy/heldRewrite).
 * - Crypto-shredding under a legal hold: deleting a tenant's data keys destroys its encrypted
 *   data as surely as deleting the rows, and no hold stopped it. A key is not deleted while a
 *   hold names its tenant or one of its tasks (CN008; test/tenancy/encryption).
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  const S = await targetSchema(db);
  await sql`
    SELECT setval('lease_token', greatest(
      (SELECT coalesce(max(fencing_token), 0) + 1 FROM task_lease WHERE fencing_token < ${sql.lit(COUNTED)}::bigint),
      (SELECT CASE WHEN last_value >= ${sql.lit(COUNTED)}::bigint THEN 1 WHEN is_called THEN last_value + 1 ELSE last_value END
         FROM lease_token)), false);
    ALTER TABLE task_lease ADD CONSTRAINT task_lease_token_range
      CHECK (fencing_token BETWEEN 0 AND 9007199254740991) NOT VALID;
    ALTER TABLE tool_receipt ADD CONSTRAINT tool_receipt_token_range
      CHECK (fencing_token BETWEEN 0 AND 9007199254740991) NOT VALID;

    CREATE OR REPLACE FUNCTION cairn_receipt_guard() RETURNS trigger LANGUAGE plpgsql
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    DECLARE
      t ${S}.receipt_transition;
      n ${S}.tool_receipt;
      o ${S}.tool_receipt;
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
        IF OLD.status IN ('succeeded', 'compensated', 'gated') AND ${S}.cairn_is_app_role()
           AND ((NEW.*) IS DISTINCT FROM (OLD.*)) THEN
          -- Of a gated receipt, its resolution may grow: what is written stays as it is.
          n := NEW;
          o := OLD;
          n.resolution := NULL;
          o.resolution := NULL;
          IF OLD.status = 'gated' AND n IS NOT DISTINCT FROM o
             AND starts_with(coalesce(NEW.resolution, ''), coalesce(OLD.resolution, ''))
             AND (NEW.resolution IS NOT NULL OR OLD.resolution IS NULL) THEN
            RETURN NEW;
          END IF;
          RAISE EXCEPTION 'receipt % is %: what it records never changes', OLD.receipt_id,
            CASE WHEN OLD.status = 'gated' THEN 'gated' ELSE 'settled (' || OLD.status || ')' END
            USING ERRCODE = 'CN010';
        END IF;
        RETURN NEW;
      END IF;
      -- Out of a settled state (compensated -> gated: a late success), a tenant's role moves the
      -- status and adds to the resolution; nothing of the record changes with it.
      IF OLD.status IN ('succeeded', 'compensated') AND ${S}.cairn_is_app_role() THEN
        n := NEW;
        o := OLD;
        n.status := NULL;
        o.status := NULL;
        n.resolution := NULL;
        o.resolution := NULL;
        IF n IS DISTINCT FROM o OR NOT starts_with(coalesce(NEW.resolution, ''), coalesce(OLD.resolution, '')) THEN
          RAISE EXCEPTION 'receipt % is settled (%): what it records never changes (% -> % with other columns refused)',
            OLD.receipt_id, OLD.status, OLD.status, NEW.status USING ERRCODE = 'CN010';
        END IF;
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

    -- A token a tenant's role writes is one the sequence just gave this session (acquireLease's
    -- nextval), or the row's own + 1 (acquireLease's greatest()): never one chosen by hand.
    CREATE FUNCTION cairn_lease_token_guard() RETURNS trigger LANGUAGE plpgsql
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    DECLARE
      given bigint;
    BEGIN
      IF TG_OP = 'UPDATE' AND NEW.fencing_token = OLD.fencing_token THEN
        RETURN NEW;
      END IF;
      IF NOT ${S}.cairn_is_app_role() THEN
        RETURN NEW;
      END IF;
      IF TG_OP = 'UPDATE' AND NEW.fencing_token = OLD.fencing_token + 1 THEN
        RETURN NEW;
      END IF;
      BEGIN
        given := currval('${S}.lease_token');
      EXCEPTION WHEN object_not_in_prerequisite_state THEN
        given := NULL;
      END;
      IF given IS DISTINCT FROM NEW.fencing_token THEN
        RAISE EXCEPTION 'lease %/%: fencing token % was not given by the token sequence (tokens come from acquireLease)',
          NEW.task_id, NEW.branch, NEW.fencing_token USING ERRCODE = 'CN010';
      END IF;
      RETURN NEW;
    END
    $fn$;
    CREATE TRIGGER task_lease_token_guard BEFORE INSERT OR UPDATE OF fencing_token ON task_lease
      FOR EACH ROW EXECUTE FUNCTION cairn_lease_token_guard();

    -- What a tenant's role writes is bounded where shared processes read it (the relay, retention,
    -- the console, failover checks): a value past V8's longest string (~512 MiB rendered; jsonb
    -- renders a byte as up to 6) killed the process reading it, for every tenant. Sizes are the
    -- values' own (a CHECK sees them before compression). NOT VALID: rows already there are not
    -- checked. Topics as Kafka takes them; keys short enough to park (a btree row: tenant, topic
    -- and key under 2,704 bytes).
    ALTER TABLE outbox ADD CONSTRAINT outbox_topic_name CHECK (topic ~ '^[A-Za-z0-9._-]{1,249}$' AND topic NOT IN ('.', '..')) NOT VALID;
    ALTER TABLE outbox ADD CONSTRAINT outbox_key_size CHECK (octet_length(key) <= 2048) NOT VALID;
    ALTER TABLE outbox ADD CONSTRAINT outbox_headers_size CHECK (pg_column_size(headers) <= 16384) NOT VALID;
    ALTER TABLE task_state ADD CONSTRAINT task_state_doc_size CHECK (pg_column_size(doc) <= 33554432) NOT VALID;
    ALTER TABLE task_audit ADD CONSTRAINT task_audit_patch_size
      CHECK (pg_column_size(patch) <= 33554432 AND octet_length(coalesce(reason, '')) <= 1048576
             AND octet_length(actor) <= 65536) NOT VALID;
    ALTER TABLE checkpoint ADD CONSTRAINT checkpoint_doc_size
      CHECK (pg_column_size(doc) <= 67108864 AND octet_length(reason) <= 1048576) NOT VALID;
    ALTER TABLE tool_receipt ADD CONSTRAINT tool_receipt_text_size
      CHECK (octet_length(coalesce(error, '')) <= 1048576 AND octet_length(coalesce(resolution, '')) <= 1048576
             AND pg_column_size(result) <= 33554432 AND octet_length(worker) <= 65536) NOT VALID;

    -- A tenant reads its own retention policy only (it read every tenant's).
    ALTER TABLE retention_policy ENABLE ROW LEVEL SECURITY;
    CREATE POLICY tenant_isolation ON retention_policy
      USING (tenant_id = (SELECT ${S}.cairn_current_tenant()))
      WITH CHECK (tenant_id = (SELECT ${S}.cairn_current_tenant()));

    CREATE FUNCTION cairn_key_hold_guard() RETURNS trigger LANGUAGE plpgsql
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    BEGIN
      IF EXISTS (SELECT 1 FROM ${S}.legal_hold WHERE tenant_id = OLD.tenant_id AND released_at IS NULL) THEN
        RAISE EXCEPTION 'tenant % is under legal hold: its data keys stay (the data they encrypted must stay readable)',
          OLD.tenant_id USING ERRCODE = 'CN008';
      END IF;
      RETURN OLD;
    END
    $fn$;
    CREATE TRIGGER tenant_key_hold BEFORE DELETE ON tenant_key FOR EACH ROW EXECUTE FUNCTION cairn_key_hold_guard();
  `.execute(db);
}
