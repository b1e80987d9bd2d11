import { type Kysely, sql } from 'kysely';

/**
 * The transactional outbox and what the relay needs to publish it in order per key.
 *
 * `lane` is a hash of the key (computed by the writer, stable across versions) so all of a
 * key's messages share a lane, and each lane has one owner at a time (relay_lane), whose
 * fencing token only grows. The relay deletes rows after the broker acked them; the table
 * stays small, and a low fillfactor keeps deletes and inserts on the same pages.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE outbox (
      id          bigserial PRIMARY KEY,
      lane        integer NOT NULL CHECK (lane >= 0),
      message_id  uuid NOT NULL UNIQUE,
      tenant_id   text,
      topic       text NOT NULL,
      key         text NOT NULL,
      headers     jsonb NOT NULL DEFAULT '{}',
      payload     bytea NOT NULL,
      created_at  timestamptz NOT NULL DEFAULT now(),
      attempts    integer NOT NULL DEFAULT 0,
      last_error  text
    ) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
    CREATE INDEX outbox_lane_id ON outbox (lane, id);

    CREATE TABLE relay_lane (
      lane          integer PRIMARY KEY,
      owner         text,
      fencing_token bigint NOT NULL DEFAULT 0,
      expires_at    timestamptz NOT NULL DEFAULT '-infinity'
    );

    CREATE TABLE relay_instance (
      instance_id text PRIMARY KEY,
      started_at  timestamptz NOT NULL DEFAULT now(),
      last_seen   timestamptz NOT NULL DEFAULT now()
    );

    -- A key whose head message failed for a non-retriable reason: its later messages wait
    -- (order per key) while every other key keeps flowing.
    CREATE TABLE outbox_parked_key (
      topic       text NOT NULL,
      key         text NOT NULL,
      message_id  uuid NOT NULL,
      error       text NOT NULL,
      parked_at   timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (topic, key)
    );

    -- What operators did to the outbox: release a key, skip a message. Append-only.
    CREATE TABLE outbox_operator_audit (
      id          bigserial PRIMARY KEY,
      action      text NOT NULL CHECK (action IN ('release', 'skip')),
      topic       text,
      key         text,
      message_id  uuid,
      actor       text NOT NULL,
      reason      text NOT NULL,
      detail      jsonb NOT NULL DEFAULT '{}',
      at          timestamptz NOT NULL DEFAULT now()
    );
  `.execute(db);
}
