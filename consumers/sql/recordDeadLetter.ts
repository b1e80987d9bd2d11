import { sql } from 'kysely';
import type { Trx } from '../../src/db/executor.js';
import { deadLetterIdentity, type InboxMessage } from '../inboxMessage.js';

/**
 * Text Postgres stores: a NUL byte is refused in text and jsonb (22021, 22P05), and a tenant
 * puts one in an error by a payload its handler fails to parse (JSON.parse quotes it), or a
 * producer outside Cairn in a header: the dead letter was refused, and the consumer ran the
 * handler again at each restart, for ever. (A message id, tenant or key: deadLetterIdentity.)
 */
const storable = (s: string): string => s.replaceAll('\u0000', '\uFFFD');
const storableHeaders = (h: Record<string, string>): string =>
  JSON.stringify(Object.fromEntries(Object.entries(h).map(([k, v]) => [storable(k), storable(v)])));

/**
 * Marks the message handled (as dead-lettered) and keeps it for `cairn inbox replay`; never
 * over an applied row (a revoked consumer finishing its batch after the partition's new
 * owner applied the message): then nothing is recorded and false is returned.
 */
export async function recordDeadLetter(
  trx: Trx,
  a: { groupId: string; message: InboxMessage; error: string; attempts: number },
): Promise<boolean> {
  const m = a.message;
  const { messageId, tenantId, key, inboxKey } = deadLetterIdentity(m);
  const { rows } = await sql<{ outcome: string }>`
    INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", key, tenant_id, outcome)
    VALUES (${a.groupId}, ${messageId}, ${m.topic}, ${m.partition}, ${m.offset}::bigint, ${inboxKey},
            ${tenantId}, 'dead_lettered')
    ON CONFLICT (consumer_group, (coalesce(tenant_id, '')), message_id) DO UPDATE SET outcome = 'dead_lettered'
      WHERE inbox.outcome <> 'applied'
    RETURNING outcome
  `.execute(trx);
  if (rows.length === 0) return false;
  await sql`
    INSERT INTO inbox_dlq (consumer_group, tenant_id, message_id, topic, partition, "offset", key, headers, payload, error, attempts)
    VALUES (${a.groupId}, ${tenantId}, ${messageId}, ${m.topic}, ${m.partition}, ${m.offset}::bigint,
            ${key}, ${storableHeaders(m.headers)}::jsonb, ${m.value}, ${storable(a.error)}, ${a.attempts})
    ON CONFLICT (consumer_group, (coalesce(tenant_id, '')), message_id)
      DO UPDATE SET error = EXCLUDED.error, attempts = EXCLUDED.attempts, replayed_at = NULL
  `.execute(trx);
  return true;
}
