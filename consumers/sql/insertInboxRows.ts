import { sql } from 'kysely';
import type { Executor, Trx } from '../../src/db/executor.js';
import type { InboxMessage } from '../inboxMessage.js';

type Recorded = Pick<InboxMessage, 'messageId' | 'tenantId' | 'topic' | 'partition' | 'offset' | 'key'>;

/** What an inbox row is unique by within a group: message ids are per tenant. */
export const inboxKey = (m: Pick<InboxMessage, 'messageId' | 'tenantId'>) =>
  `${m.tenantId ?? ''}\u0000${m.messageId}`;

/**
 * Records a chunk of messages as applied, in the handler's transaction, and returns the
 * (tenant, id) pairs (inboxKey) that were new. One statement for the whole chunk (unnest)
 * instead of one per message; ON CONFLICT DO NOTHING turns a redelivered id into "not new"
 * without an error, and a concurrent consumer inserting the same id blocks on the unique
 * index until this transaction ends, so two consumers never both see an id as new.
 */
export async function insertInboxRows(
  trx: Trx,
  groupId: string,
  messages: readonly Recorded[],
): Promise<Set<string>> {
  const { rows } = await sql<{ message_id: string; tenant_id: string | null }>`
    INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", key, tenant_id)
    SELECT ${groupId}, m.id, m.topic, m.partition, m.off, m.key, m.tenant
      FROM unnest(${messages.map((m) => m.messageId)}::text[], ${messages.map((m) => m.topic)}::text[],
                  ${messages.map((m) => m.partition)}::int[], ${messages.map((m) => m.offset)}::bigint[],
                  ${messages.map((m) => m.key)}::text[], ${messages.map((m) => m.tenantId ?? null)}::text[])
           AS m(id, topic, partition, off, key, tenant)
    ON CONFLICT (consumer_group, (coalesce(tenant_id, '')), message_id) DO NOTHING
    RETURNING message_id, tenant_id
  `.execute(trx);
  return new Set(rows.map((r) => inboxKey({ messageId: r.message_id, tenantId: r.tenant_id ?? undefined })));
}

/** Has the group applied this message (an inbox row with outcome 'applied')? */
export async function appliedBy(
  db: Executor,
  groupId: string,
  m: Pick<InboxMessage, 'messageId' | 'tenantId'>,
): Promise<boolean> {
  const row = await db
    .selectFrom('inbox')
    .select('outcome')
    .where('consumer_group', '=', groupId)
    .where(sql<boolean>`coalesce(tenant_id, '') = ${m.tenantId ?? ''}`)
    .where('message_id', '=', m.messageId)
    .executeTakeFirst();
  return row?.outcome === 'applied';
}
