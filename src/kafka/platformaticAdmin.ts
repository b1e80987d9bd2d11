import { randomUUID } from 'node:crypto';
import { Admin, Consumer, type Message } from '@platformatic/kafka';
import { UnavailableError } from '../errors.js';
import type { AdminClientOptions, KafkaAdmin, TopicRecord } from './admin.js';
import { connectOrUnavailable, isRetriableKafkaError, isUnknownTopic } from './classifyError.js';

/** Kafka's ListOffsets timestamps for "the next offset to be written" and "the first held". */
const LATEST = -1n;
const EARLIEST = -2n;
/** Offsets and reads see committed records only, as kafkajs's admin and consumer do. */
const READ_COMMITTED = 1;

/** What both clients of this file connect with (the kafkajs admin's settings, ./publisher.ts). */
const connection = (o: AdminClientOptions) => ({
  clientId: o.clientId,
  bootstrapBrokers: o.brokers,
  connectTimeout: 3000,
  timeout: 15_000,
  retries: o.retries ?? 2,
  retryDelay: (_client: unknown, _op: string, attempt: number) => Math.min(1000, 100 * 2 ** attempt),
});

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** A KafkaAdmin on @platformatic/kafka (see ./admin.ts). */
export function createPlatformaticAdmin(o: AdminClientOptions): KafkaAdmin {
  const address = o.brokers.join(',');
  const job = `Cairn's admin client (${address})`;
  let opening: Promise<Admin> | undefined;
  /** The admin, connected: the client connects on its first request, a metadata one here. */
  function admin(): Promise<Admin> {
    opening ??= (async () => {
      const a = new Admin({ ...connection(o), autocreateTopics: false });
      try {
        await connectOrUnavailable({ connect: () => a.metadata({ topics: [] }).then(() => {}) }, job);
        return a;
      } catch (err) {
        opening = undefined; // the next use connects again
        await a.close().catch(() => {});
        throw err;
      }
    })();
    return opening;
  }

  /** Each topic's partition count (a topic the cluster does not have fails the request). */
  async function partitionCounts(a: Admin, topics: readonly string[]): Promise<Map<string, number>> {
    const meta = await a.metadata({ topics: [...topics], forceUpdate: true });
    return new Map(topics.map((t) => [t, meta.topics.get(t)?.partitionsCount ?? 0]));
  }

  return {
    address,
    async listTopics() {
      return (await admin()).listTopics({ includeInternals: true });
    },
    async topicOffsets(topic) {
      const a = await admin();
      const partitions = range((await partitionCounts(a, [topic])).get(topic) ?? 0);
      const ask = async (timestamp: bigint) => {
        const listed = await a.listOffsets({
          topics: [{ name: topic, partitions: partitions.map((p) => ({ partitionIndex: p, timestamp })) }],
          isolationLevel: READ_COMMITTED,
        });
        return new Map(
          listed.flatMap((t) => t.partitions).map((p) => [p.partitionIndex, p.offset.toString()] as const),
        );
      };
      const high = await ask(LATEST);
      const low = await ask(EARLIEST);
      return partitions.map((p) => ({ partition: p, low: low.get(p) ?? '0', high: high.get(p) ?? '0' }));
    },
    async committedOffsets(groupId, topics) {
      const a = await admin();
      const counts = await partitionCounts(a, topics);
      const [group] = await a.listConsumerGroupOffsets({
        groups: [
          { groupId, topics: topics.map((name) => ({ name, partitionIndexes: range(counts.get(name)!) })) },
        ],
      });
      const at = new Map(
        (group?.topics ?? []).flatMap((t) =>
          t.partitions.map((p) => [`${t.name}/${p.partitionIndex}`, p.committedOffset.toString()] as const),
        ),
      );
      return [...new Set(topics)].map((topic) => ({
        topic,
        partitions: range(counts.get(topic)!).map((p) => ({
          partition: p,
          offset: at.get(`${topic}/${p}`) ?? '-1',
        })),
      }));
    },
    async createTopics(topics, c) {
      const a = await admin();
      try {
        await a.createTopics({
          topics: [...topics],
          partitions: c.numPartitions,
          replicas: c.replicationFactor ?? -1,
        });
      } catch (err) {
        // Another process created them first: they exist, which is all we need.
        if (!onlyAlreadyExists(err)) throw err;
      }
      await leadersOf(a, topics, 60_000);
    },
    async readTopics(topics, lastOffsets, deadlineMs) {
      const records: TopicRecord[] = [];
      const remaining = new Map(lastOffsets);
      const consumer = new Consumer({
        ...connection(o),
        groupId: `cairn-failover-check-${randomUUID()}`,
        autocommit: false,
        maxWaitTime: 100,
      });
      try {
        const stream = await consumer.consume({
          topics: [...topics],
          mode: 'earliest',
          autocommit: false,
          maxWaitTime: 100,
          isolationLevel: READ_COMMITTED,
        });
        try {
          await new Promise<void>((resolve, reject) => {
            const timer = setTimeout(resolve, deadlineMs);
            stream.once('error', (err: Error) => {
              clearTimeout(timer);
              reject(err);
            });
            stream.on('data', (m: Message) => {
              records.push(toRecord(m));
              const id = `${m.topic}/${m.partition}`;
              const last = remaining.get(id);
              if (last !== undefined && m.offset >= last) remaining.delete(id);
              if (remaining.size === 0) {
                clearTimeout(timer);
                resolve();
              }
            });
          });
        } finally {
          await Promise.resolve(stream.close()).catch(() => {});
        }
      } finally {
        await Promise.resolve(consumer.close(true)).catch(() => {});
      }
      return { records, unread: [...remaining.keys()] };
    },
    async close() {
      const a = opening;
      opening = undefined;
      await (await a?.catch(() => undefined))?.close();
    },
  };
}

function toRecord(m: Message): TopicRecord {
  const headers: Record<string, string> = {};
  for (const [k, v] of m.headers) headers[k.toString()] = v?.toString() ?? '';
  return {
    topic: m.topic,
    partition: m.partition,
    offset: m.offset.toString(),
    key: m.key ?? null,
    value: m.value ?? null,
    headers,
    timestamp: m.timestamp.toString(),
  };
}

/** True when every broker answer in the error is "topic already exists". */
function onlyAlreadyExists(err: unknown): boolean {
  const errors = (err as { errors?: unknown[] } | null)?.errors ?? [err];
  return (
    errors.length > 0 &&
    errors.every((e) => (e as { apiId?: unknown } | null)?.apiId === 'TOPIC_ALREADY_EXISTS')
  );
}

/**
 * Waits until every partition of `topics` has a leader, asking again while the cluster answers
 * that it does not know the topic yet (each broker learns of a new topic on its own time).
 */
export async function leadersOf(a: Admin, topics: readonly string[], deadlineMs: number): Promise<void> {
  const until = Date.now() + deadlineMs;
  for (;;) {
    try {
      const meta = await a.metadata({ topics: [...topics], forceUpdate: true });
      const ready = topics.every((name) => {
        const t = meta.topics.get(name);
        return t !== undefined && t.partitionsCount > 0 && t.partitions.every((p) => p.leader >= 0);
      });
      if (ready) return;
    } catch (err) {
      // Just created, the topic may not be in the answering broker's metadata yet: platformatic
      // says "Unknown topic" (not retriable), which failed a subscriber's createTopics at start
      // (missingTopic.int under CAIRN_KAFKA_CLIENT=platformatic, once in CI).
      if (!(isRetriableKafkaError(err) || isUnknownTopic(err)) || Date.now() > until) throw err;
    }
    if (Date.now() > until)
      throw new UnavailableError(`topics ${topics.join(', ')} have no leader after ${deadlineMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
