import { sql } from 'kysely';
import type { Trx } from '../../src/db/executor.js';
import type { InboxMessage } from '../inboxMessage.js';

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
  const { rows } = await sql<{ outcome: string }>`
    INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", key, tenant_id, outcome)
    VALUES (${a.groupId}, ${m.messageId}, ${m.topic}, ${m.partition}, ${m.offset}::bigint, ${m.key},
            ${m.tenantId ?? null}, 'dead_lettered')
    ON CONFLICT (consumer_group, (coalesce(tenant_id, '')), message_id) DO UPDATE SET outcome = 'dead_lettered'
      WHERE inbox.outcome <> 'applied'
    RETURNING outcome
  `.execute(trx);
  if (rows.length === 0) return false;
  await sql`
    INSERT INTO inbox_dlq (consumer_group, tenant_id, message_id, topic, partition, "offset", key, headers, payload, error, attempts)
    VALUES (${a.groupId}, ${m.tenantId ?? null}, ${m.messageId}, ${m.topic}, ${m.partition}, ${m.offset}::bigint,
            ${m.key}, ${JSON.stringify(m.headers)}::jsonb, ${m.value}, ${a.error}, ${a.attempts})
    ON CONFLICT (consumer_group, (coalesce(tenant_id, '')), message_id)
      DO UPDATE SET error = EXCLUDED.error, attempts = EXCLUDED.attempts, replayed_at = NULL
  `.execute(trx);
  return true;
}
