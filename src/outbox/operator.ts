import { sql } from 'kysely';
import { z } from 'zod';
import type { Db } from '../db/database.js';
import { NotFoundError, ValidationError } from '../errors.js';
import { parseOptions } from '../options.js';
import { SpiffeId } from '../schemas/taskState.js';
import { TopicName } from './message.js';

export interface ParkedKey {
  /** The tenant whose key it is ('' for messages without one): keys are parked per tenant. */
  tenant: string;
  topic: string;
  key: string;
  message_id: string;
  error: string;
  parked_at: Date;
  waiting: number;
}

/** What an operator gives for an audited action; the CLI checks its flags with these too. */
export const OperatorReason = z
  .string()
  .max(2000)
  .refine((r) => r.trim() !== '', { message: 'is required: say why, it goes into the audit' });
export const OutboxMessageId = z.uuid({
  message: 'must be an outbox message id: a UUID, as `cairn outbox parked` prints it',
});
export const OutboxKey = z.string().min(1).max(1024);

const ReleaseInput = z.strictObject({
  topic: TopicName,
  key: OutboxKey,
  tenant: z.string().max(63).optional(),
  actor: SpiffeId,
  reason: OperatorReason,
});
const SkipInput = z.strictObject({
  messageId: OutboxMessageId,
  tenant: z.string().max(63).optional(),
  actor: SpiffeId,
  reason: OperatorReason,
});

/** Keys held back because their head message was refused, with how many messages wait behind it. */
export async function listParked(db: Db): Promise<ParkedKey[]> {
  return db
    .selectFrom('outbox_parked_key as p')
    .select(['p.tenant', 'p.topic', 'p.key', 'p.message_id', 'p.error', 'p.parked_at'])
    .select((eb) =>
      eb
        .selectFrom('outbox as o')
        .where(sql<boolean>`coalesce(o.tenant_id, '') = p.tenant`)
        .whereRef('o.topic', '=', 'p.topic')
        .whereRef('o.key', '=', 'p.key')
        .select(eb.fn.countAll<number>().as('n'))
        .as('waiting'),
    )
    .orderBy('p.parked_at')
    .execute() as Promise<ParkedKey[]>;
}

/**
 * Lets a parked key flow again from its head message (which is tried again). Audited. Keys
 * are parked per tenant: when two tenants have the same key parked, `tenant` says which.
 */
export async function releaseKey(
  db: Db,
  input: { topic: string; key: string; tenant?: string; actor: string; reason: string },
): Promise<void> {
  const a = parseOptions('outbox release', ReleaseInput, input);
  await db.transaction().execute(async (t) => {
    let q = t
      .selectFrom('outbox_parked_key')
      .select(['tenant', 'message_id', 'error'])
      .where('topic', '=', a.topic)
      .where('key', '=', a.key)
      .forUpdate();
    if (a.tenant !== undefined) q = q.where('tenant', '=', a.tenant);
    const found = await q.execute();
    if (found.length === 0) throw new NotFoundError('parked key', `${a.topic}/${a.key}`);
    if (found.length > 1) {
      throw new ValidationError('release', [
        {
          path: 'tenant',
          message: `key ${a.key} is parked for tenants ${found.map((f) => f.tenant || '(none)').join(', ')}: name one`,
        },
      ]);
    }
    const parked = found[0]!;
    await t
      .deleteFrom('outbox_parked_key')
      .where('tenant', '=', parked.tenant)
      .where('topic', '=', a.topic)
      .where('key', '=', a.key)
      .execute();
    await t
      .insertInto('outbox_operator_audit')
      .values({
        action: 'release',
        tenant: parked.tenant,
        topic: a.topic,
        key: a.key,
        message_id: parked.message_id,
        actor: a.actor,
        reason: a.reason,
        detail: JSON.stringify({ error: parked.error }),
      })
      .execute();
  });
}

/**
 * Drops one message from the outbox without publishing it; if it was the head of a parked
 * key, the key flows again. The message's headers and size go into the audit. Message ids are
 * unique per tenant: when two tenants have a message with this id, `tenant` ('' for none)
 * says whose, and only that one is dropped.
 */
export async function skipMessage(
  db: Db,
  input: { messageId: string; tenant?: string; actor: string; reason: string },
): Promise<void> {
  const a = parseOptions('outbox skip', SkipInput, input);
  await db.transaction().execute(async (t) => {
    let q = t.selectFrom('outbox').select(['tenant_id']).where('message_id', '=', a.messageId).forUpdate();
    if (a.tenant !== undefined) q = q.where(sql<boolean>`coalesce(tenant_id, '') = ${a.tenant}`);
    const found = await q.execute();
    if (found.length === 0) throw new NotFoundError('outbox message', a.messageId);
    // A tenant's message may have two rows (its own, and a WAL message the relay moved into the
    // table with that id: migration 0019): one message, skipped whole.
    const tenants = [...new Set(found.map((f) => f.tenant_id))];
    if (tenants.length > 1) {
      throw new ValidationError('skip', [
        {
          path: 'tenant',
          message: `message ${a.messageId} is in the outbox of tenants ${tenants.map((t) => t ?? '(none)').join(', ')}: name one`,
        },
      ]);
    }
    // By its unique key, not its id: an id past 2^53 (planted before migration 0012) reads back
    // rounded as a JavaScript number and would match nothing.
    const row = await t
      .deleteFrom('outbox')
      .where('message_id', '=', a.messageId)
      .where(sql<boolean>`coalesce(tenant_id, '') = ${found[0]!.tenant_id ?? ''}`)
      .returning(['tenant_id', 'topic', 'key', 'headers', 'payload', 'last_error'])
      .execute()
      .then((rows) => rows[0]!);
    await t
      .deleteFrom('outbox_parked_key')
      .where('message_id', '=', a.messageId)
      .where('tenant', '=', row.tenant_id ?? '')
      .execute();
    await t
      .insertInto('outbox_operator_audit')
      .values({
        action: 'skip',
        tenant: row.tenant_id,
        topic: row.topic,
        key: row.key,
        message_id: a.messageId,
        actor: a.actor,
        reason: a.reason,
        detail: JSON.stringify({
          headers: row.headers,
          bytes: row.payload.length,
          last_error: row.last_error,
        }),
      })
      .execute();
  });
}
