import { Partitioners } from 'kafkajs';
import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createInboxConsumer, type InboxConsumer } from '../../consumers/inboxConsumer.js';
import { TopicMissingError } from '../../src/errors.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase, uniqueTopic } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

const kafka = kafkaClient(kafkaBrokers(), 'missing-topic-test');
const admin = kafka.admin();
let tdb: TestDatabase;
let consumer: InboxConsumer | undefined;

beforeAll(async () => {
  tdb = await createTestDatabase('missing_topic');
  await sql`CREATE TABLE applied (message_id text PRIMARY KEY, body text NOT NULL)`.execute(tdb.db);
  await admin.connect();
});
afterEach(async () => {
  await consumer?.stop();
  consumer = undefined;
});
afterAll(async () => {
  await admin.disconnect();
  await tdb.drop();
});

function start(topic: string, createTopics?: { numPartitions: number }) {
  const groupId = `${topic}.g`;
  consumer = createInboxConsumer({
    db: tdb.db,
    groupId,
    subscriber: createKafkaSubscriber({
      brokers: kafkaBrokers(),
      groupId,
      topics: [topic],
      ...(createTopics ? { createTopics } : {}),
    }),
    dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
    handler: async (trx, m) => {
      await sql`INSERT INTO applied (message_id, body) VALUES (${m.messageId}, ${m.value?.toString() ?? ''})`.execute(
        trx,
      );
    },
  });
  return consumer;
}

describe('a consumer whose topic does not exist', () => {
  it('run() rejects at once with topic_missing naming the topic and the fix, and creates nothing', async () => {
    const topic = uniqueTopic('missing');
    const c = start(topic);
    const err = await c.run().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(TopicMissingError);
    expect(err).toMatchObject({ code: 'topic_missing', retriable: false, topics: [topic] });
    expect((err as Error).message).toContain(`"${topic}" does not exist`);
    expect((err as Error).message).toContain('createTopics');
    expect(c.waitingFor()).toBeNull(); // not reported as an outage
    // The check itself must not make a broker with auto.create.topics.enable create it.
    expect(await admin.listTopics()).not.toContain(topic);
  });

  it('with createTopics it creates the topic (the partitions asked for) and applies a message published after', async () => {
    const topic = uniqueTopic('created');
    await start(topic, { numPartitions: 2 }).run();
    const meta = await admin.fetchTopicMetadata({ topics: [topic] });
    expect(meta.topics[0]!.partitions).toHaveLength(2);

    const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
    await producer.connect();
    try {
      await producer.send({
        topic,
        acks: -1,
        messages: [{ key: 'k', value: 'hello', headers: { 'cairn-message-id': `${topic}:m1` } }],
      });
    } finally {
      await producer.disconnect();
    }
    await waitFor(
      'the message to be applied',
      async () => (await sql`SELECT 1 FROM applied`.execute(tdb.db)).rows.length === 1,
      30_000,
    );
    const rows = await sql<{
      message_id: string;
      body: string;
    }>`SELECT message_id, body FROM applied`.execute(tdb.db);
    expect(rows.rows).toEqual([{ message_id: `${topic}:m1`, body: 'hello' }]);
  });
});
