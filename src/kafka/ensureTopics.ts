import type { Admin, ITopicConfig } from 'kafkajs';
import { TopicMissingError, UnavailableError } from '../errors.js';

/** How to create the topics a subscriber finds missing. */
export interface CreateTopicsOptions {
  numPartitions: number;
  /** Default: the broker's `default.replication.factor`. */
  replicationFactor?: number;
}

/**
 * Checks that every topic exists before a consumer subscribes: kafkajs would otherwise fail
 * with a raw "This server does not host this topic-partition", or have the broker auto-create
 * it with whatever partitions the broker defaults to. With `create`, the missing ones are
 * created (and their leaders awaited); otherwise a TopicMissingError names each one and the
 * fix. Returns the topics this call created.
 *
 * listTopics, not fetchTopicMetadata: a metadata request for named topics lets a broker with
 * auto.create.topics.enable create them, which is what this check must not do.
 */
export async function ensureTopics(
  admin: Admin,
  topics: readonly string[],
  create?: CreateTopicsOptions,
): Promise<string[]> {
  const existing = new Set(await admin.listTopics());
  const missing = [...new Set(topics)].filter((t) => !existing.has(t));
  if (missing.length === 0) return [];
  const named = missing.map((t) => `"${t}"`).join(', ');
  if (!create) {
    throw new TopicMissingError(
      missing,
      `topic${missing.length > 1 ? 's' : ''} ${named} ${missing.length > 1 ? 'do' : 'does'} not exist on the broker. ` +
        'Create it (e.g. kafka-topics --create --topic <name> --partitions <n>), or pass ' +
        'createTopics: { numPartitions } to createKafkaSubscriber to have Cairn create it.',
    );
  }
  try {
    // false when another process created them first: they exist, which is all we need.
    await createTopicsAndWait(
      admin,
      missing.map((topic) => ({
        topic,
        numPartitions: create.numPartitions,
        ...(create.replicationFactor === undefined ? {} : { replicationFactor: create.replicationFactor }),
      })),
    );
  } catch (err) {
    if (!refusedForGood(err)) throw err; // an outage: the caller waits and tries again
    throw new TopicMissingError(
      missing,
      `topic${missing.length > 1 ? 's' : ''} ${named} ${missing.length > 1 ? 'do' : 'does'} not exist and the broker ` +
        `refused to create ${missing.length > 1 ? 'them' : 'it'} with numPartitions ${create.numPartitions}` +
        `${create.replicationFactor === undefined ? '' : `, replicationFactor ${create.replicationFactor}`}: ` +
        `${(err as Error).message}. Fix createTopics, or create the topic yourself.`,
      err,
    );
  }
  return missing;
}

/** A protocol answer kafkajs marks as not retriable (invalid replication factor, policy, ACL). */
function refusedForGood(err: unknown): boolean {
  const errors = (err as { errors?: unknown[] } | null)?.errors ?? [err];
  return errors.length > 0 && errors.every((e) => (e as { retriable?: unknown } | null)?.retriable === false);
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
