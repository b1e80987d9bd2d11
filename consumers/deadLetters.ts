import type { Db } from '../src/db/database.js';
import { NotFoundError } from '../src/errors.js';
import type { Publisher } from '../src/kafka/publisher.js';

export interface DeadLetter {
  consumer_group: string;
  message_id: string;
  topic: string;
  partition: number;
  offset: number;
  error: string;
  attempts: number;
  dead_at: Date;
  replayed_at: Date | null;
}

export async function listDeadLetters(db: Db, groupId?: string): Promise<DeadLetter[]> {
  let q = db
    .selectFrom('inbox_dlq')
    .select([
      'consumer_group',
      'message_id',
      'topic',
      'partition',
      'offset',
      'error',
      'attempts',
      'dead_at',
      'replayed_at',
    ])
    .orderBy('id');
  if (groupId) q = q.where('consumer_group', '=', groupId);
  return q.execute();
}

/**
 * Sends a dead letter back to its original topic with its original headers (same message
 * id). The group's inbox row is removed first, so the consumer applies it as new; a replay
 * whose publish failed can simply be run again.
 */
export async function replayDeadLetter(
  db: Db,
  publisher: Publisher,
  a: { messageId: string; groupId: string },
): Promise<DeadLetter> {
  const row = await db.transaction().execute(async (trx) => {
    const dl = await trx
      .updateTable('inbox_dlq')
      .set({ replayed_at: new Date() })
      .where('consumer_group', '=', a.groupId)
      .where('message_id', '=', a.messageId)
      .returningAll()
      .executeTakeFirst();
    if (!dl) throw new NotFoundError(`dead letter of group ${a.groupId}`, a.messageId);
    await trx
      .deleteFrom('inbox')
      .where('consumer_group', '=', a.groupId)
      .where('message_id', '=', a.messageId)
      .execute();
    return dl;
  });
  await publisher.connect();
  try {
    await publisher.publish([
      {
        topic: row.topic,
        key: row.key ?? row.message_id,
        value: row.payload ?? Buffer.alloc(0),
        headers: row.headers,
      },
    ]);
  } finally {
    await publisher.disconnect();
  }
  return row;
}
