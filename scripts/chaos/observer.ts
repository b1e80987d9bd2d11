/**
 * A consumer for the chaos soak's checker: an inbox consumer in group CHAOS_GROUP on
 * CHAOS_TOPIC that records, in the same transaction as its inbox row, every event it
 * applies (key, task version, message id) in a sequence: per-key order and exactly-once
 * application at this consumer group are then read back from Postgres.
 *
 * Environment: DATABASE_URL, KAFKA_BROKERS, CHAOS_GROUP, CHAOS_TOPIC, CHAOS_SESSION_TIMEOUT_MS
 * (default 3000: the soak freezes an observer past it).
 */
import { sql } from 'kysely';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { createDb } from '../../src/db/database.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { createLogger } from '../../src/logger.js';
import { connectionsFromEnv, countConsumerRestarts, runUntilSigterm } from '../demo/consumerProcess.js';

const { databaseUrl, brokers } = connectionsFromEnv('chaos observer');
const groupId = process.env.CHAOS_GROUP!;
const topic = process.env.CHAOS_TOPIC!;
const logger = createLogger({ name: `chaos-observer-${groupId}`, level: 'warn' });
const db = createDb({
  connectionString: databaseUrl,
  max: 3,
  applicationName: 'cairn-demo-observer',
});

const consumer = createInboxConsumer({
  db,
  groupId,
  subscriber: createKafkaSubscriber({
    brokers,
    groupId,
    topics: [topic],
    sessionTimeoutMs: Number(process.env.CHAOS_SESSION_TIMEOUT_MS ?? 3000),
    onRestart: countConsumerRestarts(db, logger),
    logger,
  }),
  dlqPublisher: createKafkaPublisher({ brokers }),
  logger,
  chunkSize: 20,
  maxAttempts: 20,
  retryBaseMs: 100,
  retryMaxMs: 2000,
  handler: async (trx, m) => {
    await sql`INSERT INTO chaos_observed (consumer_group, key, version, message_id)
              VALUES (${groupId}, ${m.key}, ${m.taskVersion ?? null}, ${m.messageId})`.execute(trx);
  },
});

await runUntilSigterm(consumer, { name: 'chaos observer', db, groupId, topics: [topic] });
