import { sql } from 'kysely';
import { createInboxConsumer, type InboxConsumer, type InboxHandler } from '../../consumers/inboxConsumer.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { kafkaBrokers, type TestDatabase } from '../support/testDatabase.js';

/**
 * The dead-letter tests' consumer and what its handler saw, on a database whose `seen (seq int)`
 * table the test file creates.
 */
export function dlqHarness(tdb: () => TestDatabase) {
  /** A handler that records the message's `seq`. */
  const recordSeq: InboxHandler = async (trx, m) => {
    await sql`INSERT INTO seen (seq) VALUES (${m.json<{ seq: number }>().seq})`.execute(trx);
  };
  const seenFrom = async (lo: number) =>
    (
      await sql<{ seq: number }>`SELECT seq FROM seen WHERE seq >= ${lo} ORDER BY seq`.execute(tdb().db)
    ).rows.map((r) => r.seq);

  /** An inbox consumer of `topic` for `fn`, stopped after it. */
  async function withConsumer(
    topic: string,
    groupId: string,
    handler: InboxHandler,
    maxAttempts: number,
    fn: (consumer: InboxConsumer) => Promise<void>,
  ): Promise<void> {
    const consumer = createInboxConsumer({
      db: tdb().db,
      groupId,
      subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId, topics: [topic] }),
      dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      handler,
      maxAttempts,
      retryBaseMs: 20,
    });
    const running = consumer.run();
    try {
      await fn(consumer);
    } finally {
      await consumer.stop();
      await running.catch(() => {});
    }
  }
  return { recordSeq, seenFrom, withConsumer };
}
