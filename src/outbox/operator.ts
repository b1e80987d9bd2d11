import type { Db } from '../db/database.js';
import { NotFoundError, ValidationError } from '../errors.js';

export interface ParkedKey {
  topic: string;
  key: string;
  message_id: string;
  error: string;
  parked_at: Date;
  waiting: number;
}

function requireReason(reason: string | undefined): string {
  if (!reason?.trim()) {
    throw new ValidationError('operator action', [
      { path: 'reason', message: 'is required: say why, it goes into the audit' },
    ]);
  }
  return reason;
}

/** Keys held back because their head message was refused, with how many messages wait behind it. */
export async function listParked(db: Db): Promise<ParkedKey[]> {
  return db
    .selectFrom('outbox_parked_key as p')
    .select(['p.topic', 'p.key', 'p.message_id', 'p.error', 'p.parked_at'])
    .select((eb) =>
      eb
        .selectFrom('outbox as o')
        .whereRef('o.topic', '=', 'p.topic')
        .whereRef('o.key', '=', 'p.key')
        .select(eb.fn.countAll<number>().as('n'))
        .as('waiting'),
    )
    .orderBy('p.parked_at')
    .execute() as Promise<ParkedKey[]>;
}

/** Lets a parked key flow again from its head message (which is tried again). Audited. */
export async function releaseKey(
  db: Db,
  a: { topic: string; key: string; actor: string; reason: string },
): Promise<void> {
  const reason = requireReason(a.reason);
  await db.transaction().execute(async (t) => {
    const parked = await t
      .deleteFrom('outbox_parked_key')
      .where('topic', '=', a.topic)
      .where('key', '=', a.key)
      .returning(['message_id', 'error'])
      .executeTakeFirst();
    if (!parked) throw new NotFoundError('parked key', `${a.topic}/${a.key}`);
    await t
      .insertInto('outbox_operator_audit')
      .values({
        action: 'release',
        topic: a.topic,
        key: a.key,
        message_id: parked.message_id,
        actor: a.actor,
        reason,
        detail: JSON.stringify({ error: parked.error }),
      })
      .execute();
  });
}

/**
 * Drops one message from the outbox without publishing it; if it was the head of a parked
 * key, the key flows again. The message's headers and size go into the audit.
 */
export async function skipMessage(
  db: Db,
  a: { messageId: string; actor: string; reason: string },
): Promise<void> {
  const reason = requireReason(a.reason);
  await db.transaction().execute(async (t) => {
    const row = await t
      .deleteFrom('outbox')
      .where('message_id', '=', a.messageId)
      .returning(['topic', 'key', 'headers', 'payload', 'last_error'])
      .executeTakeFirst();
    if (!row) throw new NotFoundError('outbox message', a.messageId);
    await t.deleteFrom('outbox_parked_key').where('message_id', '=', a.messageId).execute();
    await t
      .insertInto('outbox_operator_audit')
      .values({
        action: 'skip',
        topic: row.topic,
        key: row.key,
        message_id: a.messageId,
        actor: a.actor,
        reason,
        detail: JSON.stringify({
          headers: row.headers,
          bytes: row.payload.length,
          last_error: row.last_error,
        }),
      })
      .execute();
  });
}
