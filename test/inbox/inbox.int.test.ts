import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { Partitioners } from 'kafkajs';
import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { createInboxConsumer, type InboxConsumer, type InboxHandler } from '../../consumers/inboxConsumer.js';
import { inboxMetrics } from '../../consumers/metrics.js';
import { createKafkaAdmin } from '../../src/kafka/admin.js';
import { createKafkaPublisher, kafkaClient, type Publisher } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { cairnBundle } from '../support/cli.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';
import { createEffectsTable, effectStats, uuid } from './fixtures.js';

const run = promisify(execFile);
const kafka = kafkaClient(kafkaBrokers(), 'inbox-int-test');
let tdb: TestDatabase;
let consumer: InboxConsumer | undefined;

beforeAll(async () => {
  tdb = await createTestDatabase('inbox');
  await createEffectsTable(tdb.db);
});
afterEach(async () => {
  await consumer?.stop();
  consumer = undefined;
});
afterAll(async () => {
  await tdb.drop();
});

async function produce(
  topic: string,
  messages: Array<{ key: string; value: object; headers: Record<string, string> }>,
) {
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
  await producer.connect();
  await producer.send({
    topic,
    acks: -1,
    messages: messages.map((m) => ({ ...m, value: JSON.stringify(m.value) })),
  });
  await producer.disconnect();
}

const recordEffect: InboxHandler = async (trx, m) => {
  const { key, seq } = m.json<{ key: string; seq: number }>();
  await sql`INSERT INTO effects (message_id, key, seq, consumer) VALUES (${m.messageId}, ${key}, ${seq}, 'int')`.execute(
    trx,
  );
};

function start(
  topic: string,
  groupId: string,
  handler: InboxHandler,
  extra: {
    refuseStaleVersions?: boolean;
    dlqPublisher?: Publisher;
    onCommitted?: (c: { applied: number }) => void;
  } = {},
) {
  consumer = createInboxConsumer({
    db: tdb.db,
    groupId,
    subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId, topics: [topic] }),
    dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
    handler,
    maxAttempts: 3,
    retryBaseMs: 20,
    ...extra,
  });
  void consumer.run();
  return consumer;
}

describe('inbox consumer on a real broker and real Postgres', () => {
  it('the same message delivered 3 times (as a relay crash would) is applied once', async () => {
    await sql`TRUNCATE effects`.execute(tdb.db);
    const topic = await createTestTopic('inbox', 1);
    const id = uuid();
    const copy = { key: 'dup', value: { key: 'dup', seq: 1 }, headers: { 'cairn-message-id': id } };
    await produce(topic, [
      copy,
      copy,
      copy,
      { key: 'dup', value: { key: 'dup', seq: 2 }, headers: { 'cairn-message-id': uuid() } },
    ]);
    const c = start(topic, `${topic}.g`, recordEffect);
    await waitFor('4 deliveries', () => c.stats().applied + c.stats().duplicates >= 4, 30_000);
    expect(c.stats()).toMatchObject({ applied: 2, duplicates: 2 });
    expect(await effectStats(tdb.db)).toEqual({ total: 2, distinct_ids: 2, doubled: 0 });
    const rows = await tdb.db
      .selectFrom('inbox')
      .select(['message_id', 'outcome'])
      .where('message_id', '=', id)
      .execute();
    expect(rows).toEqual([{ message_id: id, outcome: 'applied' }]);

    // The same figures as Prometheus metrics, with the group's lag from the broker.
    const admin = createKafkaAdmin({ brokers: kafkaBrokers(), clientId: 'inbox-int-test-lag' });
    try {
      const registry = inboxMetrics(c, { db: tdb.db, groupId: `${topic}.g`, topics: [topic], admin });
      await waitFor('the offsets to be committed', async () =>
        /cairn_inbox_lag\{[^}]*\} 0$/m.test(await registry.metrics()),
      );
      const text = await registry.metrics();
      expect(text).toMatch(/^cairn_inbox_applied_total\{group="[^"]+"\} 2$/m);
      expect(text).toMatch(/^cairn_inbox_duplicates_total\{group="[^"]+"\} 2$/m);
      expect(text).toMatch(/^cairn_inbox_dlq_open\{group="[^"]+"\} 0$/m);
      expect(text).toContain('# TYPE cairn_inbox_publish_to_apply_seconds histogram');
    } finally {
      await admin.close();
    }
  });

  it('refuses a message older than the newest task version already applied for its key', async () => {
    await sql`TRUNCATE effects`.execute(tdb.db);
    const topic = await createTestTopic('inbox', 1);
    const msg = (seq: number, version: number) => ({
      key: 'task-9',
      value: { key: 'task-9', seq },
      headers: { 'cairn-message-id': uuid(), 'cairn-task-version': String(version) },
    });
    await produce(topic, [msg(1, 3), msg(2, 2), msg(3, 5), msg(4, 5)]);
    const c = start(topic, `${topic}.g`, recordEffect, { refuseStaleVersions: true });
    await waitFor('4 deliveries', () => c.stats().applied + c.stats().stale >= 4, 30_000);
    expect(c.stats()).toMatchObject({ applied: 2, stale: 2 });
    const seqs = await tdb.db
      .selectFrom('effects' as never)
      .select('seq' as never)
      .orderBy('id' as never)
      .execute();
    expect(seqs).toEqual([{ seq: 1 }, { seq: 3 }]);
  });

  it('a poison message goes to <topic>.dlq with its coordinates, the partition moves on, and replay applies it once fixed', async () => {
    await sql`TRUNCATE effects`.execute(tdb.db);
    await sql`CREATE TABLE IF NOT EXISTS fixed (ok boolean)`.execute(tdb.db);
    const topic = await createTestTopic('inbox', 1);
    const poisonId = uuid();
    await produce(topic, [
      { key: 'p', value: { key: 'p', seq: 1 }, headers: { 'cairn-message-id': uuid() } },
      { key: 'p', value: { key: 'p', seq: 2, poison: true }, headers: { 'cairn-message-id': poisonId } },
      { key: 'p', value: { key: 'p', seq: 3 }, headers: { 'cairn-message-id': uuid() } },
    ]);
    const groupId = `${topic}.g`;
    const handler: InboxHandler = async (trx, m) => {
      const body = m.json<{ poison?: boolean }>();
      const fixed = await sql<{ ok: boolean }>`SELECT ok FROM fixed`.execute(trx);
      if (body.poison && !fixed.rows[0]?.ok)
        throw Object.assign(new Error('payload refused by the handler: seq 2 is malformed'), {
          retriable: false,
        });
      await recordEffect(trx, m);
    };
    const c = start(topic, groupId, handler);
    await waitFor(
      'the poison to be dead-lettered and seq 3 applied',
      () => c.stats().deadLettered === 1 && c.stats().applied === 2,
      30_000,
    );

    const dlq = await readTopic(kafka, `${topic}.dlq`, (ms) => ms.length >= 1, 30_000);
    expect(dlq[0]!.headers).toMatchObject({
      'cairn-message-id': poisonId,
      'cairn-dlq-error': 'payload refused by the handler: seq 2 is malformed',
      'cairn-dlq-consumer-group': groupId,
      'cairn-dlq-original-topic': topic,
      'cairn-dlq-original-partition': '0',
      'cairn-dlq-original-offset': '1',
    });
    const listed = await run(process.execPath, [cairnBundle(), 'inbox', 'dlq', '--group', groupId], {
      cwd: repoRoot,
      env: { ...process.env, DATABASE_URL: tdb.url },
    });
    expect(listed.stdout).toContain(`${groupId}\t${poisonId}\t${topic}/0@1\t1 attempts`);

    await sql`INSERT INTO fixed VALUES (true)`.execute(tdb.db);
    await run(process.execPath, [cairnBundle(), 'inbox', 'replay', poisonId, '--group', groupId], {
      cwd: repoRoot,
      env: { ...process.env, DATABASE_URL: tdb.url, KAFKA_BROKERS: kafkaBrokers().join(',') },
    });
    await waitFor('the replayed message to be applied', () => c.stats().applied === 3, 30_000);
    const seqs = await tdb.db
      .selectFrom('effects' as never)
      .select('seq' as never)
      .orderBy('id' as never)
      .execute();
    expect(seqs).toEqual([{ seq: 1 }, { seq: 3 }, { seq: 2 }]);
  });

  it('a dead-letter publisher that could not connect once (a broker restarting) connects for the next dead letter', async () => {
    await sql`TRUNCATE effects`.execute(tdb.db);
    const topic = await createTestTopic('inbox', 1);
    const poisonIds = [uuid(), uuid()];
    await produce(topic, [
      ...poisonIds.map((id, i) => ({
        key: 'q',
        value: { key: 'q', seq: i + 1 },
        headers: { 'cairn-message-id': id },
      })),
      { key: 'q', value: { key: 'q', seq: 3 }, headers: { 'cairn-message-id': uuid() } },
    ]);
    const real = createKafkaPublisher({ brokers: kafkaBrokers() });
    let connects = 0;
    const flaky: Publisher = {
      address: real.address,
      connect: async () => {
        if (++connects === 1) throw new Error('Connection error: connect ECONNREFUSED (broker restarting)');
        await real.connect();
      },
      publish: (messages) => real.publish(messages),
      disconnect: () => real.disconnect(),
    };
    const handler: InboxHandler = async (trx, m) => {
      if (m.json<{ seq: number }>().seq < 3) {
        throw Object.assign(new Error('refused by the handler'), { retriable: false });
      }
      await recordEffect(trx, m);
    };
    const c = start(topic, `${topic}.g`, handler, { dlqPublisher: flaky });
    // The first dead letter fails with the connect and is tried again (the batch is redelivered);
    // before the fix the rejected connect was kept and no dead letter ever went out again.
    await waitFor(
      'both poisons dead-lettered and seq 3 applied',
      () => c.stats().deadLettered === 2 && c.stats().applied === 1,
      60_000,
    );
    expect(connects).toBe(2);
    const dlq = await readTopic(kafka, `${topic}.dlq`, (ms) => ms.length >= 2, 30_000);
    expect(new Set(dlq.map((m) => m.headers['cairn-message-id']))).toEqual(new Set(poisonIds));
  });

  it('a handler that throws null or undefined (not an Error) is retried, then dead-lettered: the partition moves on; an onCommitted that rejects is ignored', async () => {
    await sql`TRUNCATE effects`.execute(tdb.db);
    const topic = await createTestTopic('inbox', 1);
    const odd = [uuid(), uuid()];
    await produce(topic, [
      { key: 'n', value: { key: 'n', seq: 1 }, headers: { 'cairn-message-id': odd[0]! } },
      { key: 'n', value: { key: 'n', seq: 2 }, headers: { 'cairn-message-id': odd[1]! } },
      { key: 'n', value: { key: 'n', seq: 3 }, headers: { 'cairn-message-id': uuid() } },
    ]);
    const handler: InboxHandler = async (trx, m) => {
      const { seq } = m.json<{ seq: number }>();
      if (seq === 1) throw null;
      if (seq === 2) return Promise.reject(undefined);
      await recordEffect(trx, m);
    };
    // Before the fix, reading `.retriable` of null threw inside the catch: the batch failed,
    // was redelivered, failed again, forever; and a rejected onCommitted crashed the process.
    const c = start(topic, `${topic}.g`, handler, { onCommitted: async () => Promise.reject(null) });
    await waitFor(
      'both odd throws dead-lettered and seq 3 applied',
      () => c.stats().deadLettered === 2 && c.stats().applied === 1,
      60_000,
    );
    const dlq = await readTopic(kafka, `${topic}.dlq`, (ms) => ms.length >= 2, 30_000);
    expect(new Set(dlq.map((m) => m.headers['cairn-message-id']))).toEqual(new Set(odd));
  });

  it('`cairn inbox prune` deletes rows past the retention window and keeps the rest', async () => {
    await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", applied_at)
              SELECT 'prune-g', 'old-' || g, 't', 0, g, now() - interval '8 days' FROM generate_series(1, 12000) g`.execute(
      tdb.db,
    );
    await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset")
              VALUES ('prune-g', 'fresh', 't', 0, 0)`.execute(tdb.db);
    const out = await run(process.execPath, [cairnBundle(), 'inbox', 'prune', '--older-than-hours', '168'], {
      cwd: repoRoot,
      env: { ...process.env, DATABASE_URL: tdb.url },
    });
    expect(out.stdout).toContain('pruned 12000 inbox row(s) older than 168 h');
    const left = await tdb.db
      .selectFrom('inbox')
      .select('message_id')
      .where('consumer_group', '=', 'prune-g')
      .execute();
    expect(left).toEqual([{ message_id: 'fresh' }]);
  });
});
