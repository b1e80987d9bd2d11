import { Partitioners } from 'kafkajs';
import { describe, expect, it } from 'vitest';
import { recordingPartitioner, unacknowledgedPartitions } from '../../src/kafka/acknowledgements.js';

// What the Kafka publisher checks after kafkajs's sendBatch resolves (src/kafka/acknowledgements.ts;
// the broker side is test/cluster/leaderMoveMidSend.cluster.test.ts).

describe('a send counts as acknowledged only when every partition it wrote to answered', () => {
  it('names a partition that has no answer, as kafkajs returns after a leader moved to a broker that had answered', () => {
    const sent = [
      { topic: 't', partition: 0 },
      { topic: 't', partition: 1 },
      { topic: 't', partition: 1 },
      { topic: 'u', partition: 0 },
    ];
    const acks = [
      { topicName: 't', partition: 0, errorCode: 0 },
      { topicName: 'u', partition: 0, errorCode: 0 },
    ];
    expect(unacknowledgedPartitions(sent, acks)).toEqual([{ topic: 't', partition: 1 }]);
  });

  it('counts an answer with an error code, or for another topic, as none', () => {
    const sent = [{ topic: 't', partition: 0 }];
    expect(unacknowledgedPartitions(sent, [{ topicName: 't', partition: 0, errorCode: 6 }])).toHaveLength(1);
    expect(unacknowledgedPartitions(sent, [{ topicName: 'u', partition: 0, errorCode: 0 }])).toHaveLength(1);
    expect(unacknowledgedPartitions(sent, [{ topicName: 't', partition: 0, errorCode: 0 }])).toEqual([]);
  });

  it('records the partition the default partitioner chose for each message object, and chooses the same', () => {
    const partitionOf = new WeakMap<object, number>();
    const recording = recordingPartitioner(Partitioners.DefaultPartitioner, partitionOf)();
    const plain = Partitioners.DefaultPartitioner();
    const partitionMetadata = [0, 1, 2].map((p) => ({
      partitionErrorCode: 0,
      partitionId: p,
      leader: 1,
      replicas: [1],
      isr: [1],
    }));
    for (const key of ['a', 'b', 'c', 'task-7']) {
      const message = { key, value: 'v' };
      const chosen = recording({ topic: 't', partitionMetadata, message });
      expect(chosen).toBe(plain({ topic: 't', partitionMetadata, message: { key, value: 'v' } }));
      expect(partitionOf.get(message)).toBe(chosen);
    }
  });
});
