import { z } from 'zod';
import { opt, optionsSchema, parseOptions } from '../options.js';
import { defaultKafkaClient, type KafkaClientName, kafkaClientNames } from './clientChoice.js';
import { createKafkajsAdmin } from './kafkajsAdmin.js';
import { createPlatformaticAdmin } from './platformaticAdmin.js';

/** A partition's first offset still held (`low`) and the next offset to be written (`high`). */
export interface PartitionOffsets {
  partition: number;
  low: string;
  high: string;
}

/** A group's committed offset on each partition of a topic; `-1` where it committed nothing. */
export interface CommittedOffsets {
  topic: string;
  partitions: Array<{ partition: number; offset: string }>;
}

/** One record as a topic holds it. */
export interface TopicRecord {
  topic: string;
  partition: number;
  offset: string;
  key: Buffer | null;
  value: Buffer | null;
  /** Every header, decoded as UTF-8 (a repeated header's values joined with commas). */
  headers: Record<string, string>;
  /** The record's timestamp, ms since the epoch. */
  timestamp: string;
}

/**
 * What Cairn needs from a Kafka client besides publishing and consuming a group: topic
 * administration for a subscriber, offsets for the lag metric, and reading topics whole for
 * the failover check and the changelog replay. Publisher and Subscriber keep the relay and the
 * inbox off kafkajs; this keeps everything else off it.
 *
 * It connects on first use and stays connected until close(). A broker that does not answer
 * the connection is an UnavailableError; an error the client marks retriable (a leader
 * election under way) is thrown as it is, to be told apart with isRetriableKafkaError.
 */
export interface KafkaAdmin {
  /** Where it connects (the bootstrap brokers), for messages. */
  readonly address: string;
  /** Every topic on the cluster. Never creates one. */
  listTopics(): Promise<string[]>;
  /** Each partition's low and high offsets, one ask without retries of the client's own. */
  topicOffsets(topic: string): Promise<PartitionOffsets[]>;
  /** The group's committed offset on every partition of each topic. */
  committedOffsets(groupId: string, topics: readonly string[]): Promise<CommittedOffsets[]>;
  /**
   * Creates the topics and waits until each partition has a leader (deadline 60 s). A topic
   * that exists already is no error. `replicationFactor` defaults to the broker's.
   */
  createTopics(
    topics: readonly string[],
    o: { numPartitions: number; replicationFactor?: number },
  ): Promise<void>;
  /**
   * Reads `topics` from their start until every partition named in `lastOffsets`
   * ("topic/partition" -> the offset of its last record to read) was read to it, or until
   * `deadlineMs`. Returns what was read, and the partitions it could not read to the end.
   */
  readTopics(
    topics: readonly string[],
    lastOffsets: ReadonlyMap<string, bigint>,
    deadlineMs: number,
  ): Promise<{ records: TopicRecord[]; unread: string[] }>;
  /** Closes its connections; it reconnects when used again. */
  close(): Promise<void>;
}

/** What createKafkaAdmin takes. */
export interface KafkaAdminOptions {
  /** Bootstrap brokers, `host:port` each. */
  brokers: string[];
  /** The Kafka client id (default `cairn-admin`). */
  clientId?: string;
  /** The Kafka client underneath (default: CAIRN_KAFKA_CLIENT, else `kafkajs`). */
  client?: KafkaClientName;
}

const KafkaAdminOptionsSchema = optionsSchema<KafkaAdminOptions>()(
  z.strictObject({
    brokers: z.array(opt.text()).min(1, 'must name at least one broker (host:port)'),
    clientId: opt.text().optional(),
    client: z.enum(kafkaClientNames).optional(),
  }),
);

/**
 * Makes the KafkaAdmin the failover check, the changelog replay and the lag metric read a
 * cluster with, on the client chosen as for createKafkaPublisher; nothing connects until it
 * is used, and close() closes it.
 */
export function createKafkaAdmin(options: KafkaAdminOptions): KafkaAdmin {
  const opts = parseOptions('Kafka admin options', KafkaAdminOptionsSchema, options);
  return kafkaAdminOf(opts.client ?? defaultKafkaClient(), {
    brokers: opts.brokers,
    clientId: opts.clientId ?? 'cairn-admin',
  });
}

/** How a client's KafkaAdmin is made (internal: what createKafkaAdmin and a subscriber pass). */
export interface AdminClientOptions {
  brokers: string[];
  clientId: string;
  /** The client's own retries of a request (its default when absent); 0 fails at once. */
  retries?: number;
}

/** The KafkaAdmin on `client`. */
export function kafkaAdminOf(client: KafkaClientName, o: AdminClientOptions): KafkaAdmin {
  if (client === 'platformatic') return createPlatformaticAdmin(o);
  return createKafkajsAdmin(o);
}
