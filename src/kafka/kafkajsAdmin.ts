import { randomUUID } from 'node:crypto';
import type { Admin, ITopicConfig } from 'kafkajs';
import { UnavailableError } from '../errors.js';
import type { AdminClientOptions, KafkaAdmin, TopicRecord } from './admin.js';
import { connectOrUnavailable } from './classifyError.js';
import { kafkaClient } from './publisher.js';

/** A KafkaAdmin on kafkajs (see ./admin.ts). */
export function createKafkajsAdmin(o: AdminClientOptions): KafkaAdmin {
  const kafka = kafkaClient(o.brokers, o.clientId);
  const address = o.brokers.join(',');
  const job = `Cairn's admin client (${address})`;
  const admin = connectedOnUse(() =>
    kafka.admin(o.retries === undefined ? {} : { retry: { retries: o.retries } }),
  );
  // No retries inside kafkajs for offsets: it would turn a retriable "not the leader" into a
  // non-retriable "retries exceeded" before the caller's own retry could see it.
  const offsetsAdmin = connectedOnUse(() => kafka.admin({ retry: { retries: 0 } }));

  function connectedOnUse(make: () => Admin): { get(): Promise<Admin>; close(): Promise<void> } {
    let opening: Promise<Admin> | undefined;
    return {
      get() {
        opening ??= (async () => {
          const a = make();
          try {
            await connectOrUnavailable(a, job);
            return a;
          } catch (err) {
            opening = undefined; // the next use connects again
            await a.disconnect().catch(() => {});
            throw err;
          }
        })();
        return opening;
      },
      async close() {
        const a = opening;
        opening = undefined;
        await (await a?.catch(() => undefined))?.disconnect();
      },
    };
  }

  return {
    address,
    async listTopics() {
      return (await admin.get()).listTopics();
    },
    async topicOffsets(topic) {
      const offsets = await (await offsetsAdmin.get()).fetchTopicOffsets(topic);
      return offsets.map((p) => ({ partition: p.partition, low: p.low, high: p.high }));
    },
    async committedOffsets(groupId, topics) {
      const committed = await (await admin.get()).fetchOffsets({ groupId, topics: [...topics] });
      return committed.map((t) => ({
        topic: t.topic,
        partitions: t.partitions.map((p) => ({ partition: p.partition, offset: p.offset })),
      }));
    },
    async createTopics(topics, c) {
      await createTopicsAndWait(
        await admin.get(),
        topics.map((topic) => ({
          topic,
          numPartitions: c.numPartitions,
          ...(c.replicationFactor === undefined ? {} : { replicationFactor: c.replicationFactor }),
        })),
      );
    },
    async readTopics(topics, lastOffsets, deadlineMs) {
      const records: TopicRecord[] = [];
      const remaining = new Map(lastOffsets);
      const consumer = kafka.consumer({
        groupId: `cairn-failover-check-${randomUUID()}`,
        maxWaitTimeInMs: 100,
      });
      await consumer.connect();
      try {
        await consumer.subscribe({ topics: [...topics], fromBeginning: true });
        let done!: () => void;
        const finished = new Promise<void>((r) => {
          done = r;
        });
        await consumer.run({
          eachMessage: async ({ topic, partition, message }) => {
            records.push({
              topic,
              partition,
              offset: message.offset,
              key: message.key,
              value: message.value,
              headers: Object.fromEntries(
                Object.entries(message.headers ?? {}).map(([k, v]) => [k, String(v ?? '')]),
              ),
              timestamp: message.timestamp,
            });
            const id = `${topic}/${partition}`;
            const last = remaining.get(id);
            if (last !== undefined && BigInt(message.offset) >= last) remaining.delete(id);
            if (remaining.size === 0) done();
          },
        });
        const timer = setTimeout(done, deadlineMs);
        await finished;
        clearTimeout(timer);
      } finally {
        await consumer.disconnect();
      }
      return { records, unread: [...remaining.keys()] };
    },
    async close() {
      await Promise.all([admin.close(), offsetsAdmin.close()]);
    },
  };
}

/**
 * Creates topics and waits until every partition has a leader, asking again while a broker
 * answers that it does not host the topic yet. kafkajs's own `waitForLeaders` gives up on that
 * answer, which a cluster of several brokers gives for a moment after every creation (the
 * controller tells each broker on its own time). Returns false when they all existed already.
 */
export async function createTopicsAndWait(
  admin: Admin,
  topics: ITopicConfig[],
  deadlineMs = 60_000,
): Promise<boolean> {
  const created = await admin.createTopics({ topics, waitForLeaders: false });
  const names = topics.map((t) => t.topic);
  const until = Date.now() + deadlineMs;
  for (;;) {
    try {
      const meta = await admin.fetchTopicMetadata({ topics: names });
      if (meta.topics.every((t) => t.partitions.length > 0 && t.partitions.every((p) => p.leader >= 0))) {
        return created;
      }
    } catch (err) {
      if ((err as { retriable?: unknown }).retriable !== true || Date.now() > until) throw err;
    }
    if (Date.now() > until)
      throw new UnavailableError(`topics ${names.join(', ')} have no leader after ${deadlineMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
