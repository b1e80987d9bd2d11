import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';
import { SqlState, sqlState } from '../../src/db/sqlstate.js';

/**
 * Parks a tenant's key at its head message and records the error on the row, only for the
 * relay that holds the row's lane under the token it read the row with ('lane lost', nothing
 * written, when it does not any more) and only while the row is there ('row gone').
 */
export async function parkKey(
  db: Executor,
  p: {
    tenant: string | null;
    topic: string;
    key: string;
    messageId: string;
    id: number;
    error: string;
    /** The lane's owner and fencing token the row was read under. */
    lane: { lane: number; owner: string; token: number };
  },
): Promise<'parked' | 'row gone' | 'lane lost'> {
  // Only while the row is still in the outbox (locked, so a concurrent `cairn outbox skip`
  // either waits for the park and removes it, or has removed the row first): a relay that was
  // frozen while it isolated a refused batch must not park a key, on waking, at a message an
  // operator skipped or another relay delivered meanwhile. And only under the lane's token
  // (locked, so a take-over waits for the park): another relay that took the lane may have
  // sent the message and not deleted it yet (review). A lease run out that nobody took keeps
  // its token: nobody else has sent from the lane, and the park holds.
  const { rows } = await sql<{ held: boolean; row: boolean }>`
    WITH lane AS (
      SELECT lane FROM relay_lane
       WHERE lane = ${p.lane.lane} AND owner = ${p.lane.owner} AND fencing_token = ${p.lane.token}
       FOR SHARE
    ), row AS (
      SELECT id FROM outbox WHERE id = ${p.id} AND EXISTS (SELECT 1 FROM lane) FOR KEY SHARE
    ), parked AS (
      INSERT INTO outbox_parked_key (tenant, topic, key, message_id, error)
      SELECT ${p.tenant ?? ''}, ${p.topic}, ${p.key}, ${p.messageId}::uuid, ${p.error} FROM row
      ON CONFLICT (tenant, topic, key) DO NOTHING
    )
    SELECT EXISTS (SELECT 1 FROM lane) AS held, EXISTS (SELECT 1 FROM row) AS row
  `.execute(db);
  if (!rows[0]?.held) return 'lane lost';
  if (!rows[0].row) return 'row gone';
  // A row that breaks a CHECK added after it was written (headers, a topic Kafka refuses, a
  // key or headers too large: migrations 0008, 0017) cannot be updated at all: the park alone
  // holds its key, and the error is on the parked key.
  // Under the lane's token again: a relay paused here must not write its error on a row the
  // lane's next owner has in hand (review).
  await sql`UPDATE outbox SET attempts = attempts + 1, last_error = ${p.error}
             WHERE id = ${p.id} AND EXISTS (
               SELECT 1 FROM relay_lane
                WHERE lane = ${p.lane.lane} AND owner = ${p.lane.owner} AND fencing_token = ${p.lane.token})`
    .execute(db)
    .catch((err: unknown) => {
      if (sqlState(err) !== SqlState.checkViolation) throw err;
    });
  return 'parked';
}
