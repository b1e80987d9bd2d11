import type { Consumer } from 'kafkajs';
import { kafkaClient } from './publisher.js';

export interface ReceivedMessage {
  topic: string;
  partition: number;
  offset: string;
  key: string | null;
  value: Buffer | null;
  headers: Record<string, string>;
}

export interface ReceivedBatch {
  topic: string;
  partition: number;
  messages: readonly ReceivedMessage[];
  /** False once the partition was revoked or the consumer is stopping: stop and commit nothing. */
  isActive(): boolean;
  heartbeat(): Promise<void>;
  /** Moves the client's read position past `offset` (in memory; commit() makes it durable). */
  resolveOffset(offset: string): void;
}

/**
 * What the inbox consumer needs from a Kafka client: batches per partition, in order, and an
 * explicit offset commit (never an automatic one: the offset moves only after the database
 * transaction committed). kafkajs is behind this so another client can replace it.
 */
export interface Subscriber {
  run(eachBatch: (batch: ReceivedBatch) => Promise<void>): Promise<void>;
  /** Commits `nextOffset` (the offset of the next message to read) for one partition. */
  commit(topic: string, partition: number, nextOffset: string): Promise<void>;
  stop(): Promise<void>;
}

export function createKafkaSubscriber(opts: {
  brokers: string[];
  groupId: string;
  topics: string[];
  clientId?: string;
  fromBeginning?: boolean;
  sessionTimeoutMs?: number;
}): Subscriber {
  const kafka = kafkaClient(opts.brokers, opts.clientId ?? `cairn-inbox-${opts.groupId}`);
  let consumer: Consumer | undefined;
  return {
    async run(eachBatch) {
      consumer = kafka.consumer({
        groupId: opts.groupId,
        sessionTimeout: opts.sessionTimeoutMs ?? 10_000,
        heartbeatInterval: 1000,
        maxWaitTimeInMs: 100,
        retry: { retries: 10, initialRetryTime: 200, maxRetryTime: 3000 },
      });
      await consumer.connect();
      await consumer.subscribe({ topics: opts.topics, fromBeginning: opts.fromBeginning ?? true });
      await consumer.run({
        autoCommit: false,
        eachBatchAutoResolve: false,
        partitionsConsumedConcurrently: 3,
        eachBatch: async ({ batch, isRunning, isStale, heartbeat, resolveOffset }) => {
          await eachBatch({
            topic: batch.topic,
            partition: batch.partition,
            messages: batch.messages.map((m) => {
              const headers: Record<string, string> = {};
              for (const [k, v] of Object.entries(m.headers ?? {})) {
                if (v !== undefined) headers[k] = Array.isArray(v) ? String(v[0]) : String(v);
              }
              return {
                topic: batch.topic,
                partition: batch.partition,
                offset: m.offset,
                key: m.key?.toString() ?? null,
                value: m.value,
                headers,
              };
            }),
            isActive: () => isRunning() && !isStale(),
            heartbeat,
            resolveOffset,
          });
        },
      });
    },
    async commit(topic, partition, nextOffset) {
      await consumer?.commitOffsets([{ topic, partition, offset: nextOffset }]);
    },
    async stop() {
      await consumer?.disconnect();
      consumer = undefined;
    },
  };
}
