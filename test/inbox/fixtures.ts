import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Message, Partitioners } from 'kafkajs';
import { sql } from 'kysely';
import { v7 as uuidv7 } from 'uuid';
import { localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys } from '../../src/crypto/tenantKeys.js';
import type { Db } from '../../src/db/database.js';
import { createTopicsAndWait } from '../../src/kafka/kafkajsAdmin.js';
import { createKafkaPublisher, kafkaClient, type Publisher } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber, type ReceivedMessage, type Subscriber } from '../../src/kafka/subscriber.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase, uniqueTopic } from '../support/testDatabase.js';

export async function createEffectsTable(db: Db): Promise<void> {
  await sql`CREATE TABLE effects (id bigserial PRIMARY KEY, message_id text NOT NULL, key text NOT NULL,
            seq int NOT NULL, consumer text NOT NULL)`.execute(db);
}

/** Sends `messages` to `topic` as they are (acks from every replica), with a producer of its own. */
export async function produceTo(topic: string, messages: Message[]): Promise<void> {
  const producer = kafkaClient(kafkaBrokers(), 'inbox-test-producer').producer({
    createPartitioner: Partitioners.DefaultPartitioner,
  });
  await producer.connect();
  try {
    await producer.send({ topic, acks: -1, messages });
  } finally {
    await producer.disconnect();
  }
}

/**
 * Produces `perKey` messages for each of `keys` keys, seq rising per key, each with a
 * cairn-message-id. With `more`, goes on past `perKey` (up to `more.maxPerKey`) until
 * `more.until()` holds: a stream that lasts until what a test waits for happened, on a busy
 * machine as on a quiet one.
 */
export async function produceKeyed(
  brokers: string[],
  topic: string,
  keys: number,
  perKey: number,
  pauseMs = 0,
  more?: { until: () => Promise<boolean>; maxPerKey: number },
): Promise<string[]> {
  const kafka = kafkaClient(brokers, 'inbox-test-producer');
  const producer = kafka.producer({
    idempotent: true,
    maxInFlightRequests: 1,
    createPartitioner: Partitioners.DefaultPartitioner,
  });
  await producer.connect();
  const ids: string[] = [];
  for (let seq = 0; seq < perKey || (more && seq < more.maxPerKey && !(await more.until())); seq++) {
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

/**
 * A new topic of one partition holding `n` messages, keyed k0..k49 in turn, the value of
 * message i `value(i)` (default `m<i>`), sent 1,000 at a time. Returns the topic's name.
 */
export async function oneTopicOf(name: string, n: number, value = (i: number) => `m${i}`): Promise<string> {
  const topic = uniqueTopic(name);
  const kafka = kafkaClient(kafkaBrokers(), 'inbox-test-producer');
  const admin = kafka.admin();
  await admin.connect();
  await createTopicsAndWait(admin, [{ topic, numPartitions: 1 }]);
  await admin.disconnect();
  const producer = kafka.producer();
  await producer.connect();
  for (let i = 0; i < n; i += 1000)
    await producer.send({
      topic,
      messages: Array.from({ length: Math.min(1000, n - i) }, (_, j) => ({
        key: `k${(i + j) % 50}`,
        value: value(i + j),
      })),
    });
  await producer.disconnect();
  return topic;
}

/** The test broker's subscriber (from the beginning) and dead-letter publisher for an inbox consumer of `groupId`. */
export function onTestBroker(
  groupId: string,
  topic: string,
  clientId?: string,
): { subscriber: Subscriber; dlqPublisher: Publisher } {
  return {
    subscriber: createKafkaSubscriber({
      brokers: kafkaBrokers(),
      groupId,
      topics: [topic],
      fromBeginning: true,
      ...(clientId ? { clientId } : {}),
    }),
    dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
  };
}

/** A dead-letter publisher for consumers fed by a stub subscriber: publishes nowhere. */
export const nowherePublisher = {
  connect: async () => {},
  publish: async () => {},
  disconnect: async () => {},
} as unknown as Publisher;

/** `n` messages of topic `t`, partition 0, key `k`, offsets 0.., message ids `<prefix>-<offset>`. */
export function stubMessages(prefix: string, n: number): ReceivedMessage[] {
  return Array.from({ length: n }, (_, i) => ({
    topic: 't',
    partition: 0,
    offset: String(i),
    key: 'k',
    value: Buffer.from('x'),
    headers: { 'cairn-message-id': `${prefix}-${i}` },
  }));
}

/**
 * A new topic with one partition per entry of `partitions`, holding that entry's values in
 * order (key `p<partition>`). Returns the topic's name.
 */
export async function topicOfPartitions(name: string, partitions: readonly string[][]): Promise<string> {
  const topic = uniqueTopic(name);
  const kafka = kafkaClient(kafkaBrokers(), 'inbox-test-producer');
  const admin = kafka.admin();
  await admin.connect();
  await createTopicsAndWait(admin, [{ topic, numPartitions: partitions.length }]);
  await admin.disconnect();
  const producer = kafka.producer();
  await producer.connect();
  for (const [partition, values] of partitions.entries())
    for (let i = 0; i < values.length; i += 1000)
      await producer.send({
        topic,
        messages: values.slice(i, i + 1000).map((value) => ({ partition, key: `p${partition}`, value })),
      });
  await producer.disconnect();
  return topic;
}

/**
 * A test database with tenants acme and globex, each with a data key under a fresh keyring file
 * and a task whose artifact is encrypted (`T-acme`, `T-globex`), and an `effects` table for the
 * handler: what the key provider tests share.
 */
export async function keyedTenants(name: string): Promise<{ t: TestDatabase; keyringPath: string }> {
  const t = await createTestDatabase(name);
  await sql`CREATE TABLE effects (message_id text PRIMARY KEY, plan text)`.execute(t.db);
  const keyringPath = join(mkdtempSync(join(tmpdir(), `cairn-${name}-`)), 'keyring.json');
  writeKeyring(keyringPath);
  const keys = createTenantKeys({ db: t.db, provider: localKeyring(keyringPath) });
  const store = createTaskStore({ db: t.db, keys });
  for (const tenant of ['acme', 'globex']) {
    await keys.addTenant(tenant);
    await store.create({
      task: {
        ...newTask(`T-${tenant}`, { tenant_id: tenant }),
        artifacts: { implementation_plan: `s3://${tenant}` },
      },
      actor: AGENT,
    });
  }
  return { t, keyringPath };
}
