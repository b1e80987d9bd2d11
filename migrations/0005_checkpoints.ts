import { type Kysely, sql } from 'kysely';

/**
 * Checkpoints and their snapshots. Both are immutable: a trigger refuses UPDATE, and DELETE
 * only under retention (SET LOCAL cairn.retention = 'on'), like the audit log.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE checkpoint_snapshot (
      snapshot_id uuid PRIMARY KEY,
      task_id     text NOT NULL,
      bytes       bytea NOT NULL,
      created_at  timestamptz NOT NULL DEFAULT now()
    );

    CREATE TABLE checkpoint (
      checkpoint_id  uuid PRIMARY KEY,
      task_id        text NOT NULL,
      seq            integer NOT NULL,
      state_version  bigint NOT NULL,
      schema_version text NOT NULL,
      reason         text NOT NULL,
      doc            jsonb NOT NULL,
      digest         text NOT NULL,
      created_at     timestamptz NOT NULL DEFAULT now(),
      UNIQUE (task_id, seq)
    );

    CREATE FUNCTION checkpoint_immutable() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
      IF TG_OP = 'DELETE' AND current_setting('cairn.retention', true) = 'on' THEN
        RETURN OLD;
      END IF;
      RAISE EXCEPTION '% is immutable: % refused', TG_TABLE_NAME, TG_OP USING ERRCODE = 'CN007';
    END
    $fn$;
    CREATE TRIGGER checkpoint_immutable BEFORE UPDATE OR DELETE ON checkpoint
      FOR EACH ROW EXECUTE FUNCTION checkpoint_immutable();
    CREATE TRIGGER checkpoint_snapshot_immutable BEFORE UPDATE OR DELETE ON checkpoint_snapshot
      FOR EACH ROW EXECUTE FUNCTION checkpoint_immutable();
  `.execute(db);
}
