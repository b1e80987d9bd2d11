/**
 * A consumer process for crash tests: applies messages by inserting one row per message into
 * `effects` (no unique constraint, so a double application shows up as two rows). Settings
 * from the environment: DATABASE_URL, KAFKA_BROKERS, GROUP, TOPIC, CONSUMER_NAME, and
 * CAIRN_FAULT_KILL_AFTER_DB_COMMIT=N (SIGKILL itself after the Nth database commit, before
 * the offset commit), CAIRN_METRICS_PORT (/readyz, /metrics). Started while Postgres or the
 * broker is down, it waits for them like the demo's consumers (runUntilSigterm).
 */
import { sql } from 'kysely';
import { createInboxConsumerWithTestHooks } from '../../consumers/inboxConsumer.js';
import { connectionsFromEnv, runUntilSigterm } from '../../scripts/demo/consumerProcess.js';
import { createDb } from '../../src/db/database.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { createLogger } from '../../src/logger.js';

const env = (name: string) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is required`);
  return v;
};
const { databaseUrl, brokers } = connectionsFromEnv('effect consumer');
const db = createDb({ connectionString: databaseUrl, max: 4 });
const killAfter = process.env.CAIRN_FAULT_KILL_AFTER_DB_COMMIT
  ? Number(process.env.CAIRN_FAULT_KILL_AFTER_DB_COMMIT)
  : 0;
const name = process.env.CONSUMER_NAME ?? 'consumer';
const logger = createLogger({ name: `effect-consumer-${name}` });

const consumer = createInboxConsumerWithTestHooks(
  {
    db,
    groupId: env('GROUP'),
    subscriber: createKafkaSubscriber({
      brokers,
      groupId: env('GROUP'),
      topics: [env('TOPIC')],
      sessionTimeoutMs: 6000,
      logger,
    }),
    dlqPublisher: createKafkaPublisher({ brokers }),
    logger,
    chunkSize: Number(process.env.CHUNK_SIZE ?? 100),
    handler: async (trx, m) => {
      const { key, seq } = m.json<{ key: string; seq: number }>();
      await sql`INSERT INTO effects (message_id, key, seq, consumer) VALUES (${m.messageId}, ${key}, ${seq}, ${name})`.execute(
        trx,
      );
    },
  },
  {
    afterDbCommit: (n) => {
      if (killAfter && n >= killAfter) process.kill(process.pid, 'SIGKILL');
    },
  },
);

await runUntilSigterm(consumer, {
  name: 'effect consumer',
  db,
  groupId: env('GROUP'),
  topics: [env('TOPIC')],
});
process.stdout.write('consumer running\n');
