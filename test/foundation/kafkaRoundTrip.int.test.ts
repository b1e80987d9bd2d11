import { Kafka, logLevel, Partitioners } from 'kafkajs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { kafkaBrokers, uniqueTopic } from '../support/testDatabase.js';

const KEYS = 50;
const PER_KEY = 20; // 1,000 messages

describe('real Kafka broker round trip', () => {
  const kafka = new Kafka({ clientId: 'roundtrip-test', brokers: kafkaBrokers(), logLevel: logLevel.WARN });
  const topic = uniqueTopic('roundtrip');
  const admin = kafka.admin();

  beforeAll(async () => {
    await admin.connect();
    await admin.createTopics({ topics: [{ topic, numPartitions: 3 }], waitForLeaders: true });
  });
  afterAll(async () => {
    await admin.deleteTopics({ topics: [topic] }).catch(() => {});
    await admin.disconnect();
  });

  it('delivers 1,000 keyed messages, each key in the order it was produced', async () => {
    const producer = kafka.producer({
      idempotent: true,
      maxInFlightRequests: 1,
      createPartitioner: Partitioners.DefaultPartitioner,
    });
    await producer.connect();
    // Interleave keys so that order per key is not an accident of batching by key.
    for (let seq = 0; seq < PER_KEY; seq++) {
      await producer.send({
        topic,
        acks: -1,
        messages: Array.from({ length: KEYS }, (_, k) => ({ key: `key-${k}`, value: String(seq) })),
      });
    }
    await producer.disconnect();

    const consumer = kafka.consumer({ groupId: `${topic}.group` });
    const seen = new Map<string, number[]>();
    let total = 0;
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    const done = new Promise<void>((resolve) => {
      void consumer.run({
        eachMessage: async ({ message }) => {
          const key = message.key!.toString();
          const list = seen.get(key) ?? [];
          list.push(Number(message.value!.toString()));
          seen.set(key, list);
          total++;
          if (total === KEYS * PER_KEY) resolve();
        },
      });
    });
    await Promise.race([
      done,
      new Promise((_, reject) =>
        setTimeout(() => reject(new Error(`only ${total} of 1000 arrived in 60 s`)), 60_000),
      ),
    ]);
    await consumer.disconnect();

    expect(total).toBe(KEYS * PER_KEY);
    expect(seen.size).toBe(KEYS);
    const expected = Array.from({ length: PER_KEY }, (_, i) => i);
    for (const [, list] of seen) expect(list).toEqual(expected);
  });
});
