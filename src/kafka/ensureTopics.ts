import { TopicMissingError } from '../errors.js';
import type { KafkaAdmin } from './admin.js';
import { isRefusedKafkaError } from './classifyError.js';

/** How to create the topics a subscriber finds missing. */
export interface CreateTopicsOptions {
  numPartitions: number;
  /** Default: the broker's `default.replication.factor`. */
  replicationFactor?: number;
}

/**
 * Checks that every topic exists before a consumer subscribes: the client would otherwise fail
 * with a raw "This server does not host this topic-partition", or have the broker auto-create
 * it with whatever partitions the broker defaults to. With `create`, the missing ones are
 * created (and their leaders awaited); otherwise a TopicMissingError names each one and the
 * fix. Returns the topics this call created.
 *
 * listTopics, not fetchTopicMetadata: a metadata request for named topics lets a broker with
 * auto.create.topics.enable create them, which is what this check must not do.
 */
export async function ensureTopics(
  admin: KafkaAdmin,
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
    // A topic another process created meanwhile exists, which is all we need.
    await admin.createTopics(missing, create);
  } catch (err) {
    if (!isRefusedKafkaError(err)) throw err; // an outage: the caller waits and tries again
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
