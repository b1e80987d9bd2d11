import type { Trx } from '../../src/db/executor.js';
import type { InboxMessage } from '../inboxConsumer.js';

/** Marks the message handled (as dead-lettered) and keeps it for `cairn inbox replay`. */
export async function recordDeadLetter(
  trx: Trx,
  a: { groupId: string; message: InboxMessage; error: string; attempts: number },
): Promise<void> {
  const m = a.message;
  await trx
    .insertInto('inbox')
    .values({
      consumer_group: a.groupId,
      message_id: m.messageId,
      topic: m.topic,
      partition: m.partition,
      offset: Number(m.offset),
      outcome: 'dead_lettered',
    })
    .onConflict((oc) =>
      oc.columns(['consumer_group', 'message_id']).doUpdateSet({ outcome: 'dead_lettered' }),
    )
    .execute();
  await trx
    .insertInto('inbox_dlq')
    .values({
      consumer_group: a.groupId,
      message_id: m.messageId,
      topic: m.topic,
      partition: m.partition,
      offset: Number(m.offset),
      key: m.key,
      headers: JSON.stringify(m.headers),
      payload: m.value,
      error: a.error,
      attempts: a.attempts,
    })
    .onConflict((oc) =>
      oc
        .columns(['consumer_group', 'message_id'])
        .doUpdateSet({ error: a.error, attempts: a.attempts, replayed_at: null }),
    )
    .execute();
}
