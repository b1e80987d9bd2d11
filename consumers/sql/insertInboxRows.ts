import { sql } from 'kysely';
import type { Executor, Trx } from '../../src/db/executor.js';
import { ValidationError } from '../../src/errors.js';
import { deadLetterIdentity, type InboxMessage } from '../inboxMessage.js';

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
 *
 * The messages are one partition's (a chunk of one Kafka batch): topic and partition go as
 * single values, not as arrays of one value repeated, which pg escaped and Postgres parsed
 * element by element. bench/inbox.ts (whole-batch chunks, alternating, 4 rounds, one run): CPU
 * per message 27.0 -> 23.4 µs (Node 12.9 -> 11.3, Postgres 12.4 -> 11.1).
 */
export async function insertInboxRows(
  trx: Trx,
  groupId: string,
  messages: readonly Recorded[],
): Promise<Set<string>> {
  const first = messages[0];
  if (first === undefined) return new Set();
  const distinct = new Map<string, Recorded>();
  const ids: string[] = [];
  const offsets: string[] = [];
  const keys: (string | null)[] = [];
  const tenants: (string | null)[] = [];
  for (const m of messages) {
    if (m.topic !== first.topic || m.partition !== first.partition) {
      throw new ValidationError('inbox rows', [
        {
          path: 'messages',
          message: `must be of one partition, as the first (${first.topic}/${first.partition})`,
          value: `${m.topic}/${m.partition}`,
        },
      ]);
    }
    const k = inboxKey(m);
    if (distinct.has(k)) continue;
    distinct.set(k, m);
    ids.push(m.messageId);
    offsets.push(m.offset);
    keys.push(m.key);
    tenants.push(m.tenantId ?? null);
  }
  const inserted = await sql`
    INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", key, tenant_id)
    SELECT ${groupId}, m.id, ${first.topic}, ${first.partition}::int, m.off, m.key, m.tenant
      FROM unnest(${ids}::text[], ${offsets}::bigint[], ${keys}::text[], ${tenants}::text[])
           AS m(id, off, key, tenant)
    ON CONFLICT (consumer_group, (coalesce(tenant_id, '')), message_id) DO NOTHING
  `.execute(trx);
  if (Number(inserted.numAffectedRows) === ids.length) return new Set(distinct.keys());
  const { rows: fresh } = await writtenByThisTransaction(groupId, [...distinct.values()]).execute(trx);
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
export async function appliedBy(db: Executor, groupId: string, m: InboxMessage): Promise<boolean> {
  // As its dead letter would be recorded (a message whose id cannot be stored, by its coordinates).
  const id = deadLetterIdentity(m);
  const row = await db
    .selectFrom('inbox')
    .select('outcome')
    .where('consumer_group', '=', groupId)
    .where(sql<boolean>`coalesce(tenant_id, '') = ${id.tenantId ?? ''}`)
    .where('message_id', '=', id.messageId)
    .executeTakeFirst();
  return row?.outcome === 'applied';
}

/**
 * Whether `m` is a copy `cairn inbox replay` sent of a dead letter recorded under its
 * coordinates: its id (cairn-offset:...) is that letter's. No other message may take such an id
 * (inboxMessage.ts COORDINATES); only the owner writes inbox_dlq. The replay sends the copy
 * before it commits, holding the letter's row: a copy read at once waits for that (review: read
 * unreplayed, the copy was dead-lettered again). A replay that then rolled back (killed, or past
 * its deadline) left the letter open and its dead-lettered inbox row in place: the copy is
 * dropped as that row's duplicate, and the letter can be replayed again (review: dead-lettered
 * under its own coordinates, it was a second letter, and replaying both ran the handler twice).
 * An open letter whose row the inbox's prune removed accepts nothing.
 */
export async function replayedLetter(db: Executor, groupId: string, m: InboxMessage): Promise<boolean> {
  const row = await db
    .selectFrom('inbox_dlq')
    .select('replayed_at')
    .where('consumer_group', '=', groupId)
    .where(sql<boolean>`coalesce(tenant_id, '') = ${m.tenantId ?? ''}`)
    .where('message_id', '=', m.messageId)
    .forShare()
    .executeTakeFirst();
  if (!row) return false;
  if (row.replayed_at !== null) return true;
  // Open: only while its dead-lettered row is there to drop the copy. Once pruned, a message
  // under that id would be applied in the letter's place, and the letter never replayed (review).
  const held = await db
    .selectFrom('inbox')
    .select('outcome')
    .where('consumer_group', '=', groupId)
    .where(sql<boolean>`coalesce(tenant_id, '') = ${m.tenantId ?? ''}`)
    .where('message_id', '=', m.messageId)
    .forShare()
    .executeTakeFirst();
  return held?.outcome === 'dead_lettered';
}
