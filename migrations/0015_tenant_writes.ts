import { type Kysely, sql } from 'kysely';
import { APP_ROLE } from './0006_tenancy.js';
import { targetSchema } from './schema.js';

/**
 * What a tenant's own SQL could do to everyone else through rows of its own (the tenant review
 * of session 12, each a test):
 * - DELETE on its outbox rows: a DELETE left open in a transaction held the row's lock, and the
 *   relay's fenced delete of that published row waited for it, holding every lane it owns:
 *   every tenant's messages stopped (test/tenancy/relayRowLock). Only the relay (a published
 *   row) and an operator (`cairn outbox skip`) delete outbox rows; without DELETE (nor UPDATE,
 *   revoked by 0008) a tenant cannot lock one either.
 * - a payload of any size: the library refuses one over its limit (1 MiB by default) at
 *   enqueue, but an INSERT took up to 1 GB, and a row past ~268 MB reaches node-postgres as a
 *   hex string longer than V8 allows: the relay's claim never settled, on every lane
 *   (test/tenancy/hugePayload). 64 MiB is far past any broker's message size (such a row is
 *   parked when the broker refuses it). NOT VALID: rows already there are not checked.
 * - a settled receipt (succeeded, compensated) rewritten: its result, digest or error are the
 *   record of what happened; a tenant's UPDATE changed them with the status unchanged, under a
 *   legal hold too (test/tenancy/heldRewrite). Operators (the owner) keep their hand on it.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  const S = await targetSchema(db);
  const role = sql.id(APP_ROLE);
  await sql`
    REVOKE DELETE ON outbox FROM ${role};
    ALTER TABLE outbox ADD CONSTRAINT outbox_payload_size CHECK (octet_length(payload) <= 67108864) NOT VALID;

    CREATE OR REPLACE FUNCTION cairn_receipt_guard() RETURNS trigger LANGUAGE plpgsql
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
        IF OLD.status IN ('succeeded', 'compensated') AND ${S}.cairn_is_app_role()
           AND (NEW.result, NEW.result_digest, NEW.result_enc, NEW.result_key_id, NEW.error, NEW.resolution,
                NEW.attempt, NEW.worker, NEW.started_at, NEW.finished_at)
               IS DISTINCT FROM
               (OLD.result, OLD.result_digest, OLD.result_enc, OLD.result_key_id, OLD.error, OLD.resolution,
                OLD.attempt, OLD.worker, OLD.started_at, OLD.finished_at) THEN
          RAISE EXCEPTION 'receipt % is settled (%): what it records never changes', OLD.receipt_id, OLD.status
            USING ERRCODE = 'CN010';
        END IF;
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
  `.execute(db);
}
