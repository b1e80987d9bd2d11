// The dead-letter topics (`<topic>.dlq`) an inbox consumer publishes to (review findings):
// nothing created them, a topic name of 246-249 characters gave one Kafka always refuses, and
// a broker error while dead-lettering was thrown out of the batch: the Kafka consumer crashed
// and restarted, disrupting all its partitions and running the poison message's handler
// maxAttempts more times on each restart. The local test broker has
// auto.create.topics.enable=true (cli/stack/kafka.ts): a topic that exists before any dead
// letter was sent was created by the consumer.
import { ConfigResourceTypes } from 'kafkajs';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { createTopicsAndWait } from '../../src/kafka/kafkajsAdmin.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase, uniqueTopic } from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';
import { oneTopicOf } from './fixtures.js';

const kafka = kafkaClient(kafkaBrokers(), 'dead-letter-topic-test');
const admin = kafka.admin();
let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase('dead_letter_topic');
  await sql`CREATE TABLE effects (message_id text PRIMARY KEY)`.execute(t.db);
  await admin.connect();
});
afterAll(async () => {
  await admin.disconnect();
  await t?.drop();
});

it('run() creates the dead-letter topic of each topic it reads, before any dead letter', async () => {
  const topic = await oneTopicOf('dlq-created', 1);
  const groupId = `${topic}.g`;
  const consumer = createInboxConsumer({
    db: t.db,
    groupId,
    subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId, topics: [topic] }),
    dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
    handler: async () => {},
  });
  await consumer.run();
  const topics = await admin.listTopics();
  await consumer.stop();
  expect(topics).toContain(`${topic}.dlq`);
}, 60_000);

it('a topic whose dead-letter topic name Kafka cannot take (246 characters + .dlq) is refused at start, naming it', async () => {
  const base = uniqueTopic('dlq-long');
  const topic = base + 'x'.repeat(246 - base.length); // a topic Kafka takes (at most 249)
  await createTopicsAndWait(admin, [{ topic, numPartitions: 1 }]);
  const groupId = 'dlq-long.g';
  const failure = await (async () => {
    const consumer = createInboxConsumer({
      db: t.db,
      groupId,
      subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId, topics: [topic] }),
      dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      handler: async () => {},
    });
    await consumer.run();
    await consumer.stop();
  })().then(
    () => undefined,
    (err: unknown) => err as Error,
  );
  expect(failure?.message).toContain(`${topic}.dlq`);
  expect(failure?.message).toContain('249');
}, 60_000);

it('a dead letter the broker refuses is waited for: no crash or restart, the handler not run again, one dead letter once the broker takes it', async () => {
  const topic = await oneTopicOf('dlq-refused', 3, (i) => (i === 1 ? 'p'.repeat(4000) : `m${i}`));
  // The dead-letter topic takes at most 1 KB per batch: the 4 KB poison message is refused
  // (MESSAGE_TOO_LARGE) until the test raises the limit.
  await createTopicsAndWait(admin, [
    {
      topic: `${topic}.dlq`,
      numPartitions: 1,
      configEntries: [{ name: 'max.message.bytes', value: '1024' }],
    },
  ]);
  const groupId = `${topic}.g`;
  let runs = 0;
  let restarts = 0;
  const consumer = createInboxConsumer({
    db: t.db,
    groupId,
    subscriber: createKafkaSubscriber({
      brokers: kafkaBrokers(),
      groupId,
      topics: [topic],
      onRestart: () => {
        restarts++;
      },
    }),
    dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
    maxAttempts: 2,
    retryBaseMs: 10,
    handler: async (trx, m) => {
      if (m.offset === '1') {
        runs++;
        throw new Error('poison');
      }
      await sql`INSERT INTO effects (message_id) VALUES (${m.messageId})`.execute(trx);
    },
  });
  await consumer.run();
  // Before the fix this never came: the Kafka consumer crashed and restarted instead.
  const waited = await waitFor(
    'the consumer to wait for the broker to take the dead letter',
    () => consumer.waitingFor() === 'kafka',
    30_000,
  ).then(
    () => true,
    () => false,
  );
  try {
  } finally {
    await admin.alterConfigs({
      validateOnly: false,
      resources: [
        {
          type: ConfigResourceTypes.TOPIC,
          name: `${topic}.dlq`,
          configEntries: [{ name: 'max.message.bytes', value: '1048588' }],
        },
      ],
    });
  }
  await waitFor('the dead letter', () => consumer.stats().deadLettered === 1, 60_000);
  await waitFor('the message after it', () => consumer.stats().applied === 2, 30_000);
  await consumer.stop();
  const dlq = await readTopic(kafka, `${topic}.dlq`, () => false, 5_000);
  expect({
    waited,
    runs,
    restarts,
    deadLetters: dlq.length,
    effects: (await sql`SELECT 1 FROM effects`.execute(t.db)).rows.length,
  }).toEqual({
    waited: true,
    runs: 3, // once in its chunk, then maxAttempts alone: never again while the dead letter waits
    restarts: 0,
    deadLetters: 1,
    effects: 2,
  });
}, 120_000);
