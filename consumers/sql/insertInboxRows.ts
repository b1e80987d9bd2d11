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
 *
 * A second copy of an id within the chunk is dropped here, before the insert, so the row
 * count tells the common case apart: every row inserted means every distinct message is new,
 * and no row comes back to parse (RETURNING one per message cost Node about 1 µs per message,
 * bench/inbox.ts). Only when some were in the inbox already (a redelivery) are the new ones
 * read back: the rows of this chunk that this transaction wrote (`xmin`: the insert is the
 * transaction's first write, made outside any savepoint).
 */
export async function insertInboxRows(
  trx: Trx,
  groupId: string,
  messages: readonly Recorded[],
): Promise<Set<string>> {
  const distinct = new Map<string, Recorded>();
  for (const m of messages) {
    const k = inboxKey(m);
    if (!distinct.has(k)) distinct.set(k, m);
  }
  const rows = [...distinct.values()];
  const ids = rows.map((m) => m.messageId);
  const inserted = await sql`
    INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", key, tenant_id)
    SELECT ${groupId}, m.id, m.topic, m.partition, m.off, m.key, m.tenant
      FROM unnest(${ids}::text[], ${rows.map((m) => m.topic)}::text[],
                  ${rows.map((m) => m.partition)}::int[], ${rows.map((m) => m.offset)}::bigint[],
                  ${rows.map((m) => m.key)}::text[], ${rows.map((m) => m.tenantId ?? null)}::text[])
           AS m(id, topic, partition, off, key, tenant)
    ON CONFLICT (consumer_group, (coalesce(tenant_id, '')), message_id) DO NOTHING
  `.execute(trx);
  if (Number(inserted.numAffectedRows) === rows.length) return new Set(distinct.keys());
  const { rows: fresh } = await writtenByThisTransaction(groupId, rows).execute(trx);
  return new Set(fresh.map((r) => inboxKey({ messageId: r.message_id, tenantId: r.tenant_id ?? undefined })));
}

/**
 * Which of these rows this transaction inserted. Looked up by the whole unique key, (group,
 * tenant, id) pair by pair, so each pair is one probe of the unique index: keyed by group and
 * id alone, the index (group, coalesce(tenant_id, ''), id) narrows only to the group (Postgres
 * 15 has no skip scan) and the read-back walks every row the group retains, on the redelivery
 * path a slow consumer takes (test/inbox/insertInboxRows.int.test.ts counts the buffers).
 */
export function writtenByThisTransaction(
  groupId: string,
  rows: readonly Pick<Recorded, 'messageId' | 'tenantId'>[],
) {
  return sql<{ message_id: string; tenant_id: string | null }>`
    SELECT i.message_id, i.tenant_id
      FROM unnest(${rows.map((m) => m.tenantId ?? '')}::text[], ${rows.map((m) => m.messageId)}::text[]) AS k(tenant, id)
      JOIN inbox i ON i.consumer_group = ${groupId} AND coalesce(i.tenant_id, '') = k.tenant AND i.message_id = k.id
     WHERE i.xmin = pg_current_xact_id()::xid
  `;
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
