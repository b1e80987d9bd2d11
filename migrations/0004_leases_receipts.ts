import { type Kysely, sql } from 'kysely';

/**
 * Leases with fencing tokens, and tool receipts.
 *
 * A lease row outlives its holder (holder NULL after release) so that the fencing token of a
 * (task, branch) only ever grows. Expiry is always judged by the database's now().
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE task_lease (
      task_id       text NOT NULL,
      branch        text NOT NULL,
      holder        text,
      lease_id      uuid,
      fencing_token bigint NOT NULL,
      acquired_at   timestamptz NOT NULL DEFAULT now(),
      expires_at    timestamptz NOT NULL,
      PRIMARY KEY (task_id, branch)
    );

    CREATE TABLE tool_receipt (
      receipt_id      uuid PRIMARY KEY,
      idempotency_key text NOT NULL UNIQUE,
      task_id         text NOT NULL,
      step            text NOT NULL,
      tool            text NOT NULL,
      args_digest     text NOT NULL,
      status          text NOT NULL CHECK (status IN ('started', 'succeeded', 'failed', 'uncertain', 'compensated', 'gated')),
      attempt         integer NOT NULL DEFAULT 1,
      irreversible    boolean NOT NULL DEFAULT false,
      worker          text NOT NULL,
      lease_task_id   text,
      lease_branch    text,
      lease_id        uuid,
      fencing_token   bigint,
      result          jsonb,
      result_digest   text,
      error           text,
      resolution      text,
      started_at      timestamptz NOT NULL DEFAULT now(),
      finished_at     timestamptz
    );
    CREATE INDEX tool_receipt_task ON tool_receipt (task_id, started_at);
  `.execute(db);
}
