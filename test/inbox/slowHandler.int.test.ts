/**
 * A handler slower than the group's session timeout (an agent's model call of a minute, say):
 * with kafkajs, which heartbeats only when asked, the coordinator dropped the member while the
 * handler ran; its offset commit then failed and the batch came again (the inbox turned it
 * into duplicates, the handler's work waited a rebalance). The consumer now heartbeats while
 * a handler runs.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createInboxConsumer, type InboxHandler } from '../../consumers/inboxConsumer.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { produceTo, uuid } from './fixtures.js';

let tdb: TestDatabase;
beforeAll(async () => {
  tdb = await createTestDatabase('inbox_slow_handler');
  await sql`CREATE TABLE seen (seq int NOT NULL)`.execute(tdb.db);
});
afterAll(async () => {
  await tdb?.drop();
});

it('a handler slower than the session timeout keeps the partition: applied once, its offset committed, no batch again', async () => {
  const topic = await createTestTopic('inbox-slow-handler', 1);
  await produceTo(
    topic,
    [7, 8].map((seq) => ({
      key: 'k',
      value: JSON.stringify({ seq }),
      headers: { 'cairn-message-id': uuid() },
    })),
  );
  const handler: InboxHandler = async (trx, m) => {
    const { seq } = m.json<{ seq: number }>();
    if (seq === 7) await new Promise((r) => setTimeout(r, 9000)); // past the 6 s session
    await sql`INSERT INTO seen (seq) VALUES (${seq})`.execute(trx);
  };
  const groupId = `${topic}.g`;
  const consumer = createInboxConsumer({
    db: tdb.db,
    groupId,
    subscriber: createKafkaSubscriber({
      brokers: kafkaBrokers(),
      groupId,
      topics: [topic],
      sessionTimeoutMs: 6000,
    }),
    dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
    handler,
  });
  const running = consumer.run();
  try {
    await waitFor('both applied', () => consumer.stats().applied === 2, 40_000);
    expect(consumer.stats().offsetCommitFailures).toBe(0);
    expect(consumer.stats().duplicates).toBe(0);
    const { rows } = await sql<{ seq: number }>`SELECT seq FROM seen ORDER BY seq`.execute(tdb.db);
    expect(rows.map((r) => r.seq)).toEqual([7, 8]);
  } finally {
    await consumer.stop();
    await running.catch(() => {});
  }
}, 60_000);
