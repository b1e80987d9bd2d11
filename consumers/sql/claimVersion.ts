import { sql } from 'kysely';
import type { Trx } from '../../src/db/executor.js';

/**
 * Raises the newest applied (version, seq) of a tenant's key if this message's is newer;
 * returns false (the message is stale: it, or something after it, was already applied) and
 * marks the inbox row so, otherwise. `seq` is the message's place within its change
 * (cairn-task-seq): the messages one change causes share a version, and each of them must
 * still be applied once, in order.
 */
export async function claimVersion(
  trx: Trx,
  a: {
    groupId: string;
    tenantId: string | null;
    key: string;
    version: number;
    seq: number;
    messageId: string;
  },
): Promise<boolean> {
  const { rows } = await sql<{ version: number }>`
    INSERT INTO inbox_key_version (consumer_group, tenant_id, key, version, seq)
    VALUES (${a.groupId}, ${a.tenantId}, ${a.key}, ${a.version}, ${a.seq})
    ON CONFLICT (consumer_group, (coalesce(tenant_id, '')), key) DO UPDATE
      SET version = EXCLUDED.version, seq = EXCLUDED.seq
      WHERE (inbox_key_version.version, inbox_key_version.seq) < (EXCLUDED.version, EXCLUDED.seq)
    RETURNING version
  `.execute(trx);
  if (rows.length === 1) return true;
  await trx
    .updateTable('inbox')
    .set({ outcome: 'stale' })
    .where('consumer_group', '=', a.groupId)
    .where(sql<boolean>`coalesce(tenant_id, '') = ${a.tenantId ?? ''}`)
    .where('message_id', '=', a.messageId)
    .execute();
  return false;
}
