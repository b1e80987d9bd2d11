import { type Kysely, sql } from 'kysely';

/**
 * Inbox: which message ids a consumer group has applied (the row is written in the same
 * transaction as the handler's effects), the newest task version applied per key (to refuse
 * stale messages), and the dead letters.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE inbox (
      consumer_group text NOT NULL,
      message_id     text NOT NULL,
      topic          text NOT NULL,
      partition      integer NOT NULL,
      "offset"       bigint NOT NULL,
      outcome        text NOT NULL DEFAULT 'applied' CHECK (outcome IN ('applied', 'stale', 'dead_lettered')),
      applied_at     timestamptz NOT NULL DEFAULT now(),
      PRIMARY KEY (consumer_group, message_id)
    );
    CREATE INDEX inbox_applied_at ON inbox (applied_at);

    CREATE TABLE inbox_key_version (
      consumer_group text NOT NULL,
      key            text NOT NULL,
      version        bigint NOT NULL,
      PRIMARY KEY (consumer_group, key)
    );

    CREATE TABLE inbox_dlq (
      id             bigserial PRIMARY KEY,
      consumer_group text NOT NULL,
      message_id     text NOT NULL,
      topic          text NOT NULL,
      partition      integer NOT NULL,
      "offset"       bigint NOT NULL,
      key            text,
      headers        jsonb NOT NULL,
      payload        bytea,
      error          text NOT NULL,
      attempts       integer NOT NULL,
      dead_at        timestamptz NOT NULL DEFAULT now(),
      replayed_at    timestamptz,
      UNIQUE (consumer_group, message_id)
    );
  `.execute(db);
}
