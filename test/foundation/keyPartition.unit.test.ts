import { randomBytes } from 'node:crypto';
import { Partitioners } from 'kafkajs';
import { describe, expect, it } from 'vitest';
import { keyPartition } from '../../src/kafka/keyPartition.js';

describe('keyPartition', () => {
  it('places every key on the partition kafkajs DefaultPartitioner chooses (so switching clients keeps order per key)', () => {
    const kafkajs = Partitioners.DefaultPartitioner();
    const keys = [Buffer.from(''), Buffer.from('a'), Buffer.from('task-1')];
    for (let i = 0; i < 2000; i++) keys.push(randomBytes(i % 41));
    for (const key of keys) {
      for (const n of [1, 3, 7, 12, 64]) {
        const partitionMetadata = Array.from({ length: n }, (_, partitionId) => ({
          partitionId,
          leader: 0,
          partitionErrorCode: 0,
          replicas: [0],
          isr: [0],
        }));
        const expected = kafkajs({ topic: 't', partitionMetadata, message: { key, value: null } });
        expect(keyPartition(key, n)).toBe(expected);
      }
    }
  });
});
