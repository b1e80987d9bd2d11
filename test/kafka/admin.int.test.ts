/**
 * What the library asks of a KafkaAdmin (src/kafka/admin.ts), against the real broker, on the
 * client CAIRN_KAFKA_CLIENT names: run it once per client, and once more for a client added.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { TopicMissingError } from '../../src/errors.js';
import { createKafkaAdmin } from '../../src/kafka/admin.js';
import { ensureTopics } from '../../src/kafka/ensureTopics.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
import { kafkaBrokers, uniqueTopic } from '../support/testDatabase.js';

const admin = createKafkaAdmin({ brokers: kafkaBrokers(), clientId: 'kafka-admin-test' });
const kafka = kafkaClient(kafkaBrokers(), 'kafka-admin-test-producer');
afterAll(async () => {
  await admin.close();
});

describe('KafkaAdmin', () => {
  it('creates topics (again: no error), lists them, and gives each partition its offsets', async () => {
    const topic = uniqueTopic('admin');
    expect(await admin.listTopics()).not.toContain(topic);
    await admin.createTopics([topic], { numPartitions: 2 });
    await admin.createTopics([topic], { numPartitions: 2 }); // exists already: nothing to do
    expect(await admin.listTopics()).toContain(topic);
    const producer = kafka.producer();
    await producer.connect();
    await producer.send({
      topic,
      messages: [
        { partition: 1, key: 'k', value: 'a', headers: { h: 'x' } },
        { partition: 1, key: null, value: null },
      ],
    });
    await producer.disconnect();
    const offsets = await admin.topicOffsets(topic);
    expect(offsets.sort((a, b) => a.partition - b.partition)).toEqual([
      { partition: 0, low: '0', high: '0' },
      { partition: 1, low: '0', high: '2' },
    ]);
  });

  it("reads a topic's records from its start up to the offsets asked for, keys, values and headers kept", async () => {
    const topic = uniqueTopic('admin-read');
    await admin.createTopics([topic], { numPartitions: 1 });
    const producer = kafka.producer();
    await producer.connect();
    await producer.send({
      topic,
      messages: [
        { key: 'k1', value: 'v1', headers: { 'cairn-message-id': 'm1' }, timestamp: '1700000000000' },
        { key: 'k2', value: 'v2' },
      ],
    });
    await producer.disconnect();
    const { records, unread } = await admin.readTopics([topic], new Map([[`${topic}/0`, 1n]]), 30_000);
    expect(unread).toEqual([]);
    expect(
      records.map((r) => ({
        ...r,
        key: r.key?.toString(),
        value: r.value?.toString(),
        timestamp: undefined,
      })),
    ).toEqual([
      {
        topic,
        partition: 0,
        offset: '0',
        key: 'k1',
        value: 'v1',
        headers: { 'cairn-message-id': 'm1' },
        timestamp: undefined,
      },
      { topic, partition: 0, offset: '1', key: 'k2', value: 'v2', headers: {}, timestamp: undefined },
    ]);
    expect(records[0]!.timestamp).toBe('1700000000000');
  });

  it("gives a group's committed offset on every partition, -1 where it committed nothing", async () => {
    const topic = uniqueTopic('admin-group');
    const groupId = `${topic}.g`;
    await admin.createTopics([topic], { numPartitions: 2 });
    expect(await admin.committedOffsets(groupId, [topic])).toEqual([
      {
        topic,
        partitions: expect.arrayContaining([
          { partition: 0, offset: '-1' },
          { partition: 1, offset: '-1' },
        ]),
      },
    ]);
    const a = kafka.admin();
    await a.connect();
    await a.setOffsets({ groupId, topic, partitions: [{ partition: 1, offset: '5' }] });
    await a.disconnect();
    const [committed] = await admin.committedOffsets(groupId, [topic]);
    expect(committed!.partitions.sort((x, y) => x.partition - y.partition)).toEqual([
      { partition: 0, offset: '-1' },
      { partition: 1, offset: '5' },
    ]);
  });

  it('a creation the broker refuses for good (a replication factor past its brokers) is a TopicMissingError naming it', async () => {
    const topic = uniqueTopic('admin-refused');
    const err = await ensureTopics(admin, [topic], { numPartitions: 1, replicationFactor: 3 }).catch(
      (e) => e,
    );
    expect(err).toBeInstanceOf(TopicMissingError);
    expect((err as Error).message).toMatch(/refused to create it with numPartitions 1, replicationFactor 3/);
    expect(await admin.listTopics()).not.toContain(topic);
  });

  it('a broker that does not answer is an UnavailableError', async () => {
    const nobody = createKafkaAdmin({ brokers: ['127.0.0.1:1'], clientId: 'kafka-admin-test' });
    const err = await nobody.listTopics().catch((e) => e);
    await nobody.close();
    expect(err).toMatchObject({ code: 'unavailable', retriable: true });
  });
});
