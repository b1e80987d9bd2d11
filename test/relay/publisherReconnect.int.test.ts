import { describe, expect, it } from 'vitest';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { freePort, startTcpProxy } from '../support/tcpProxy.js';
import { createTestTopic, kafkaBrokers } from '../support/testDatabase.js';
import { readTopic } from '../support/topicReader.js';

describe('Kafka publisher', () => {
  it('a publisher whose connect failed (the broker was down) connects again when it next publishes', async () => {
    const topic = await createTestTopic('publisher_reconnect', 1);
    const [host, port] = kafkaBrokers()[0]!.split(':') as [string, string];
    // Bootstrap through a port where nothing listens yet: the broker is "down".
    const bootstrap = await freePort();
    const publisher = createKafkaPublisher({ brokers: [`127.0.0.1:${bootstrap}`] });
    await expect(publisher.connect()).rejects.toThrow();
    const proxy = await startTcpProxy(bootstrap, { host, port: Number(port) });
    try {
      // Before, this producer only answered "The producer is disconnected" until the relay's
      // next reconnect, which it reached after spending a batch's retries (~10 s) on it.
      await publisher.publish([{ topic, key: 'k', value: Buffer.from('after the outage'), headers: {} }]);
      const kafka = kafkaClient(kafkaBrokers(), 'publisher-reconnect-test');
      const got = await readTopic(kafka, topic, (ms) => ms.length >= 1, 30_000);
      expect(got.map((m) => m.value)).toEqual(['after the outage']);
    } finally {
      await publisher.disconnect().catch(() => {});
      await proxy.close();
    }
  });
});
