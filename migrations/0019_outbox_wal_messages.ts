import { type Kysely, sql } from 'kysely';
import { APP_ROLE } from './0006_tenancy.js';
import { targetSchema } from './schema.js';

/**
 * Outbox messages written to the WAL only (issue 16, the WAL relay's message mode): an insert
 * into `outbox_wal` is checked like an outbox row (the tenant triggers, the sizes and names of
 * 0008/0015/0017) and then becomes a transactional logical decoding message
 * (`pg_logical_emit_message`), not a row: nothing is stored, claimed, deleted or vacuumed, and
 * the relay streaming the slot publishes it in commit order.
 *
 * Who can write one: the same roles as an outbox row (a tenant's role as itself, the outbox's
 * owner). The message is emitted by the trigger, as the owner, with a secret only the owner
 * can read (`outbox_wal_secret`): any role may call `pg_logical_emit_message` itself (PUBLIC
 * can, by default), and the relay drops a message without the secret, so no role forges
 * another tenant's message. A message emitted while no relay's slot is registered in
 * `outbox_wal_reader` would be lost (the WAL keeps it only for a slot): the insert is refused
 * instead (55000), before anything is written.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  const S = await targetSchema(db);
  const role = sql.id(APP_ROLE);
  await sql`
    CREATE TABLE outbox_wal_reader (
      slot_name text PRIMARY KEY,
      -- The server's timeline when the relay registered (the first 8 digits of a WAL file's
      -- name): a standby promoted since has another, and no slot of the old primary's.
      timeline text NOT NULL,
      registered_at timestamptz NOT NULL DEFAULT now(),
      -- The last WAL message a relay moved into the table (relay/wal/walToTable.ts): the slot
      -- may deliver it again after a crash (its position is saved at checkpoints), and what
      -- an operator skipped since must not come back.
      moved_lsn pg_lsn
    );
    CREATE INDEX outbox_operator_audit_skipped ON outbox_operator_audit (message_id) WHERE action = 'skip';
    -- Known to the outbox's owner alone (its trigger writes it into each message, the relay
    -- checks it): a role that may call pg_logical_emit_message itself (PUBLIC may, by default)
    -- cannot write a message the relay takes for the outbox's.
    -- One, for good: a message in flight carries it, and one the relay refuses is not published.
    CREATE TABLE outbox_wal_secret (secret text NOT NULL CHECK (secret ~ '^[0-9a-f]{64}$'));
    CREATE UNIQUE INDEX outbox_wal_secret_one ON outbox_wal_secret ((true));
    INSERT INTO outbox_wal_secret VALUES (replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', ''));
    REVOKE ALL ON outbox_wal_secret FROM PUBLIC;
    CREATE FUNCTION cairn_outbox_wal_secret_kept() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
      RAISE EXCEPTION 'the outbox''s WAL message secret is never changed: every message not yet published carries it'
        USING ERRCODE = '55000';
    END
    $fn$;
    CREATE TRIGGER outbox_wal_secret_kept BEFORE UPDATE OR DELETE ON outbox_wal_secret
      FOR EACH ROW EXECUTE FUNCTION cairn_outbox_wal_secret_kept();
    CREATE TRIGGER outbox_wal_secret_not_truncated BEFORE TRUNCATE ON outbox_wal_secret
      FOR EACH STATEMENT EXECUTE FUNCTION cairn_outbox_wal_secret_kept();
    CREATE TABLE outbox_wal (
      message_id   uuid NOT NULL,
      tenant_id    text,
      task_id      text,
      task_version bigint,
      task_seq     integer,
      topic        text NOT NULL,
      key          text NOT NULL,
      headers      jsonb NOT NULL DEFAULT '{}',
      payload      bytea NOT NULL,
      created_at   timestamptz NOT NULL DEFAULT now()
    );
    GRANT INSERT (message_id, tenant_id, task_id, task_version, task_seq, topic, key, headers, payload)
      ON outbox_wal TO ${role};

    -- Before anything is emitted: a registered slot exists, so the message has a reader.
    CREATE FUNCTION cairn_outbox_wal_reader() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    BEGIN
      -- A slot still being made (it waits for running transactions) is listed with no
      -- confirmed position yet, and will not decode what commits meanwhile; after a promotion
      -- the registration came over with the data, the slot did not: the relay registers again.
      IF NOT EXISTS (
        SELECT 1 FROM ${S}.outbox_wal_reader w JOIN pg_replication_slots s ON s.slot_name = w.slot_name
         WHERE s.database = current_database() AND s.wal_status IS DISTINCT FROM 'lost'
           AND s.confirmed_flush_lsn IS NOT NULL
           AND w.timeline = substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)
      ) THEN
        RAISE EXCEPTION 'outbox messages to the WAL need a relay in WAL mode reading them on this database (no registered replication slot): start one, or write outbox rows'
          USING ERRCODE = '55000';
      END IF;
      RETURN NULL;
    END
    $fn$;
    CREATE TRIGGER outbox_wal_reader BEFORE INSERT ON outbox_wal
      FOR EACH STATEMENT EXECUTE FUNCTION cairn_outbox_wal_reader();

    -- One trigger does what outbox rows take three for (the tenant and task triggers of 0006 and
    -- 0008, the CHECKs of 0008/0015/0017): each trigger call with its own search_path costs a
    -- few microseconds per message.
    CREATE FUNCTION cairn_outbox_wal_emit() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    DECLARE
      writer text := ${S}.cairn_current_tenant();
      token bytea;
      header bytea;
      emitted pg_lsn;
    BEGIN
      -- What the outbox's row-level security asks of a row: a tenant's role writes as itself,
      -- any other role only as the outbox's owner (current_user here: this function's owner).
      -- NOT NULL is checked after BEFORE triggers, and this one stores nothing: checked here.
      IF NEW.message_id IS NULL OR NEW.topic IS NULL OR NEW.key IS NULL OR NEW.headers IS NULL
         OR NEW.payload IS NULL OR NEW.created_at IS NULL THEN
        RAISE EXCEPTION 'outbox message %: message_id, topic, key, headers, payload and created_at may not be null', NEW.message_id
          USING ERRCODE = '23502';
      END IF;
      IF writer IS NOT NULL THEN
        NEW.tenant_id := writer;
      ELSIF NOT pg_has_role(session_user, current_user, 'MEMBER') THEN
        RAISE EXCEPTION 'outbox message %: only a tenant''s role, or the outbox''s owner, writes outbox messages', NEW.message_id
          USING ERRCODE = '42501';
      END IF;
      -- Conditions with a subquery run through the executor (microseconds each): only when needed.
      IF NEW.task_id IS NOT NULL THEN
        IF NOT EXISTS (
          SELECT 1 FROM ${S}.task_state s WHERE s.task_id = NEW.task_id AND s.tenant_id IS NOT DISTINCT FROM NEW.tenant_id
        ) THEN
          RAISE EXCEPTION 'outbox message %: task % does not exist (or belongs to another tenant)',
            NEW.message_id, NEW.task_id USING ERRCODE = '42501';
        END IF;
      END IF;
      IF NOT (NEW.topic ~ '^[A-Za-z0-9._-]{1,249}$' AND NEW.topic NOT IN ('.', '..')) THEN
        RAISE EXCEPTION 'outbox message %: topic is not a Kafka topic name', NEW.message_id USING ERRCODE = '23514';
      END IF;
      -- A task version past what a JavaScript number holds would not survive the relay's
      -- reading (and a message moved into the table with it could never be written).
      IF NEW.task_version NOT BETWEEN 0 AND 9007199254740991 OR NEW.task_seq < 0 THEN
        RAISE EXCEPTION 'outbox message %: task_version % or task_seq % out of range', NEW.message_id, NEW.task_version, NEW.task_seq
          USING ERRCODE = '22003';
      END IF;
      IF octet_length(NEW.key) > 2048 OR octet_length(NEW.payload) > 67108864 THEN
        RAISE EXCEPTION 'outbox message %: key over 2 KiB or payload over 64 MiB', NEW.message_id USING ERRCODE = '23514';
      END IF;
      IF NEW.headers <> '{}' THEN
        -- cairn_headers_ok(), inline: a call of a function with its own search_path costs ~20 µs.
        IF pg_column_size(NEW.headers) > 16384 OR jsonb_typeof(NEW.headers) <> 'object' OR EXISTS (
          SELECT 1 FROM jsonb_each(NEW.headers) e WHERE jsonb_typeof(e.value) <> 'string' OR lower(e.key) LIKE 'cairn-%'
        ) THEN
          RAISE EXCEPTION 'outbox message %: headers not an object of strings, over 16 KiB, or named cairn-*', NEW.message_id
            USING ERRCODE = '23514';
        END IF;
      END IF;
      SELECT decode(w.secret, 'hex') INTO token FROM ${S}.outbox_wal_secret w;
      header := convert_to(json_build_object(
        'm', NEW.message_id, 't', NEW.tenant_id, 'i', NEW.task_id, 'v', NEW.task_version, 's', NEW.task_seq,
        'p', NEW.topic, 'k', NEW.key, 'h', NEW.headers,
        'c', CASE WHEN isfinite(NEW.created_at) THEN floor(extract(epoch FROM NEW.created_at) * 1000) END
      )::text, 'UTF8');
      -- An assignment, not PERFORM: a plain function call skips the executor.
      emitted := pg_logical_emit_message(true, ${sql.lit(`cairn.outbox:${await schemaName(db)}`)},
        int4send(octet_length(header)) || token || header || NEW.payload);
      RETURN NULL;
    END
    $fn$;
    CREATE TRIGGER outbox_wal_emit BEFORE INSERT ON outbox_wal FOR EACH ROW EXECUTE FUNCTION cairn_outbox_wal_emit();

    -- A WAL message the relay moves into the table (its key parked, its lane held) is a row
    -- only the relay writes: a tenant's own row with the same id, its transaction left open,
    -- would make the relay's insert wait on it for good, the stream held for every tenant. The
    -- two may both exist (the same message twice: the inbox applies it once). Tenants' roles
    -- cannot set from_wal (their INSERT is granted column by column, 0012).
    ALTER TABLE outbox ADD COLUMN from_wal boolean NOT NULL DEFAULT false;
    DROP INDEX outbox_tenant_message;
    CREATE UNIQUE INDEX outbox_tenant_message ON outbox ((coalesce(tenant_id, '')), message_id) WHERE NOT from_wal;
    CREATE UNIQUE INDEX outbox_tenant_message_from_wal ON outbox ((coalesce(tenant_id, '')), message_id) WHERE from_wal;

    -- A WAL message whose key is parked, or whose lane another relay owns, is written into the
    -- outbox table by the relay (as the owner) to wait there, after its task may have been
    -- deleted: its task was checked when it was written (above). Only an owner's session
    -- that says so skips the check; a tenant's role is always checked.
    CREATE OR REPLACE FUNCTION cairn_outbox_task() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
      SET search_path = pg_catalog, ${S}, pg_temp AS $fn$
    BEGIN
      IF NEW.task_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM ${S}.task_state s WHERE s.task_id = NEW.task_id AND s.tenant_id IS NOT DISTINCT FROM NEW.tenant_id
      ) AND NOT (current_setting('cairn.relay_moves_wal_messages', true) = 'on'
                 AND ${S}.cairn_current_tenant() IS NULL AND pg_has_role(session_user, current_user, 'MEMBER')) THEN
        RAISE EXCEPTION 'outbox message %: task % does not exist (or belongs to another tenant)',
          NEW.message_id, NEW.task_id USING ERRCODE = '42501';
      END IF;
      RETURN NEW;
    END
    $fn$;
  `.execute(db);
}

async function schemaName(db: Kysely<unknown>): Promise<string> {
  const { rows } = await sql<{ schema: string }>`SELECT current_schema() AS schema`.execute(db);
  return rows[0]!.schema;
}
