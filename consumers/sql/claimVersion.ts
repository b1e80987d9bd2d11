import { sql } from 'kysely';
import type { Trx } from '../../src/db/executor.js';

/**
 * Raises the newest applied version of a key to `version` if it is newer; returns false (the
 * message is stale: an older or equal version was already applied) otherwise, and marks the
 * inbox row so.
 */
export async function claimVersion(
  trx: Trx,
  a: { groupId: string; key: string; version: number; messageId: string },
): Promise<boolean> {
  const { rows } = await sql<{ version: number }>`
    INSERT INTO inbox_key_version (consumer_group, key, version) VALUES (${a.groupId}, ${a.key}, ${a.version})
    ON CONFLICT (consumer_group, key) DO UPDATE SET version = EXCLUDED.version
      WHERE inbox_key_version.version < EXCLUDED.version
    RETURNING version
  `.execute(trx);
  if (rows.length === 1) return true;
  await trx
    .updateTable('inbox')
    .set({ outcome: 'stale' })
    .where('consumer_group', '=', a.groupId)
    .where('message_id', '=', a.messageId)
    .execute();
  return false;
}
