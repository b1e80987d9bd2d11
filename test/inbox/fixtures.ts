import { Partitioners } from 'kafkajs';
import { sql } from 'kysely';
import { v7 as uuidv7 } from 'uuid';
import type { Db } from '../../src/db/database.js';
import { kafkaClient } from '../../src/kafka/publisher.js';

export async function createEffectsTable(db: Db): Promise<void> {
  await sql`CREATE TABLE effects (id bigserial PRIMARY KEY, message_id text NOT NULL, key text NOT NULL,
            seq int NOT NULL, consumer text NOT NULL)`.execute(db);
}

/** Produces `perKey` messages for each of `keys` keys, seq rising per key, each with a cairn-message-id. */
export async function produceKeyed(
  brokers: string[],
  topic: string,
  keys: number,
  perKey: number,
  pauseMs = 0,
): Promise<string[]> {
  const kafka = kafkaClient(brokers, 'inbox-test-producer');
  const producer = kafka.producer({
    idempotent: true,
    maxInFlightRequests: 1,
    createPartitioner: Partitioners.DefaultPartitioner,
  });
  await producer.connect();
  const ids: string[] = [];
  for (let seq = 0; seq < perKey; seq++) {
    const messages = Array.from({ length: keys }, (_, k) => {
      const id = uuidv7();
      ids.push(id);
      return {
        key: `k${k}`,
        value: JSON.stringify({ key: `k${k}`, seq }),
        headers: { 'cairn-message-id': id },
      };
    });
    await producer.send({ topic, acks: -1, messages });
    if (pauseMs) await new Promise((r) => setTimeout(r, pauseMs));
  }
  await producer.disconnect();
  return ids;
}

export async function effectStats(db: Db) {
  const { rows } = await sql<{ total: number; distinct_ids: number; doubled: number }>`
    SELECT count(*)::int AS total, count(DISTINCT message_id)::int AS distinct_ids,
           (SELECT count(*)::int FROM (SELECT message_id FROM effects GROUP BY message_id HAVING count(*) > 1) d) AS doubled
      FROM effects`.execute(db);
  return rows[0]!;
}

/** Keys whose effects, in the order they were applied, do not have rising seq. */
export async function keysOutOfOrder(db: Db): Promise<string[]> {
  const { rows } = await sql<{ key: string }>`
    SELECT DISTINCT key FROM (
      SELECT key, seq, lag(seq) OVER (PARTITION BY key ORDER BY id) AS prev FROM effects) x
     WHERE prev IS NOT NULL AND seq <= prev`.execute(db);
  return rows.map((r) => r.key);
}

export function uuid(): string {
  return uuidv7();
}
