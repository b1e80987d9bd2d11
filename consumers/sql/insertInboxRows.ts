import { sql } from 'kysely';
import type { Trx } from '../../src/db/executor.js';
import type { InboxMessage } from '../inboxConsumer.js';

/**
 * Records a chunk of messages as applied, in the handler's transaction, and returns the ids
 * that were new. One statement for the whole chunk (unnest) instead of one per message;
 * ON CONFLICT DO NOTHING turns a redelivered id into "not new" without an error, and a
 * concurrent consumer inserting the same id blocks on the unique index until this
 * transaction ends, so two consumers never both see an id as new.
 */
export async function insertInboxRows(
  trx: Trx,
  groupId: string,
  messages: ReadonlyArray<
    Pick<InboxMessage, 'messageId' | 'topic' | 'partition' | 'offset' | 'key' | 'headers'>
  >,
): Promise<Set<string>> {
  const { rows } = await sql<{ message_id: string }>`
    INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", key, tenant_id)
    SELECT ${groupId}, m.id, m.topic, m.partition, m.off, m.key, m.tenant
      FROM unnest(${messages.map((m) => m.messageId)}::text[], ${messages.map((m) => m.topic)}::text[],
                  ${messages.map((m) => m.partition)}::int[], ${messages.map((m) => m.offset)}::bigint[],
                  ${messages.map((m) => m.key)}::text[], ${messages.map((m) => m.headers['cairn-tenant'] ?? null)}::text[])
           AS m(id, topic, partition, off, key, tenant)
    ON CONFLICT (consumer_group, message_id) DO NOTHING
    RETURNING message_id
  `.execute(trx);
  return new Set(rows.map((r) => r.message_id));
}
