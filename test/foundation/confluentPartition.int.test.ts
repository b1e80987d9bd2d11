import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { keyPartition } from '../../src/kafka/keyPartition.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { confluentForTests } from '../support/confluent.js';
import { createTestTopic, kafkaBrokers } from '../support/testDatabase.js';
import { readTopic } from '../support/topicReader.js';

const installed = await confluentForTests('confluentPartition.int.test.ts');

// librdkafka chooses the partition itself (no JS partitioner): this checks its murmur2_random
// against ./keyPartition.ts (kafkajs's and the Java client's choice) through a real broker.
describe.skipIf(!installed)(
  `confluent publisher${installed ? '' : ' (skipped: @confluentinc/kafka-javascript is not installed)'}`,
  () => {
    it('places 2,000 keys on the partitions kafkajs chooses, on topics of 3, 7 and 12 partitions (so switching clients keeps order per key)', async () => {
      const keys = ['a', 'task-1', 'x'.repeat(300)];
      for (let i = 0; i < 2000; i++) keys.push(randomBytes(1 + (i % 40)).toString(i % 2 ? 'hex' : 'base64'));
      const publisher = createKafkaPublisher({ brokers: kafkaBrokers(), client: 'confluent' });
      await publisher.connect();
      try {
        for (const n of [3, 7, 12]) {
          const topic = await createTestTopic(`confluent_partition_${n}`, n);
          await publisher.publish(
            keys.map((key, i) => ({ topic, key, value: Buffer.from(String(i)), headers: {} })),
          );
          const kafka = kafkaClient(kafkaBrokers(), 'confluent-partition-test');
          const got = await readTopic(kafka, topic, (ms) => ms.length >= keys.length, 60_000);
          expect(got).toHaveLength(keys.length);
          const wrong = got.filter((m) => m.partition !== keyPartition(Buffer.from(m.key), n));
          expect(wrong.map((m) => `${m.key} on ${m.partition}`)).toEqual([]);
        }
      } finally {
        await publisher.disconnect();
      }
    });
  },
);
