import { type Kysely, sql } from 'kysely';

/**
 * What operators did through `cairn console`: one row per action request, keyed by the
 * operator and the request id the page put in its form, so a double click or a resent form
 * does the action once and shows the first answer again; one that failed (or was left pending
 * by a process that died) may be sent again. Owner-only (no grants): tenants'
 * roles cannot read or forge what an operator did.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE console_action (
      id           bigserial PRIMARY KEY,
      request_id   uuid NOT NULL,
      actor        text NOT NULL,
      role         text NOT NULL CHECK (role IN ('read', 'operator')),
      scope_tenant text,
      action       text NOT NULL,
      target       text NOT NULL,
      outcome      text NOT NULL DEFAULT 'pending' CHECK (outcome IN ('pending', 'done', 'already', 'refused', 'failed')),
      detail       text,
      at           timestamptz NOT NULL DEFAULT now(),
      finished_at  timestamptz,
      UNIQUE (actor, request_id)
    );
  `.execute(db);
}
