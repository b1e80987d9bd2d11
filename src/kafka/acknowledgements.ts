import type { ICustomPartitioner, RecordMetadata } from 'kafkajs';

/** Where each message object went (a Map the publisher empties after each send, or a WeakMap). */
export interface PartitionRecord {
  get(message: object): number | undefined;
  set(message: object, partition: number): unknown;
}

/** A topic's partition that a send wrote messages to. */
export interface SentPartition {
  topic: string;
  partition: number;
}

/**
 * kafkajs's sendBatch keeps, across its own retries, the answer of each broker that already
 * acknowledged its part, and sends such a broker nothing more. When a partition's leadership
 * moves, between two of those retries, to a broker that already answered, that partition's
 * messages are never sent and the send still resolves (kafkajs 2.2.4, producer/sendMessages.js).
 * The relay then deleted rows the broker never had, and its next batch took their place:
 * brokerFailure.cluster.test.ts saw a key's messages come out 0-9, 27-39, 10-26, and
 * test/cluster/leaderMoveMidSend.cluster.test.ts makes it happen on purpose.
 *
 * So a send counts as acknowledged only when every partition its messages went to answered.
 * The partitioner below records where each message went (the message objects passed to
 * sendBatch are the ones kafkajs hands its partitioner, on every retry).
 */
export function recordingPartitioner(
  partitioner: ICustomPartitioner,
  partitionOf: PartitionRecord,
): ICustomPartitioner {
  return () => {
    const choose = partitioner();
    return (args) => {
      const partition = choose(args);
      partitionOf.set(args.message, partition);
      return partition;
    };
  };
}

/** The partitions written to that have no acknowledgement (error code 0) among `acks`. */
export function unacknowledgedPartitions(
  sent: Iterable<SentPartition>,
  acks: readonly Pick<RecordMetadata, 'topicName' | 'partition' | 'errorCode'>[],
): SentPartition[] {
  const acked = new Set(
    acks.filter((a) => a.errorCode === 0).map((a) => `${a.topicName}\u0000${a.partition}`),
  );
  const missing = new Map<string, SentPartition>();
  for (const s of sent) {
    const k = `${s.topic}\u0000${s.partition}`;
    if (!acked.has(k)) missing.set(k, s);
  }
  return [...missing.values()];
}
