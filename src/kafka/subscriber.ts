import type { Consumer } from 'kafkajs';
import { z } from 'zod';
import { type Logger, silentLogger } from '../logger.js';
import { opt, optionsSchema, parseOptions } from '../options.js';
import { kafkaAdminOf } from './admin.js';
import { defaultKafkaClient, type KafkaClientName, kafkaClientNames } from './clientChoice.js';
import { createConfluentSubscriber } from './confluentSubscriber.js';
import { type CreateTopicsOptions, ensureTopics } from './ensureTopics.js';
import { createPlatformaticSubscriber } from './platformaticSubscriber.js';
import { kafkaClient } from './publisher.js';
import { startWhenReachable } from './startConsumer.js';

export type { CreateTopicsOptions } from './ensureTopics.js';

/** One message as the broker delivered it. */
export interface ReceivedMessage {
  topic: string;
  partition: number;
  offset: string;
  key: string | null;
  value: Buffer | null;
  headers: Record<string, string>;
  /** The record's timestamp, in ms since the epoch (the producer's create time by default). */
  timestamp?: number;
}

/** The messages of one partition in one fetch, in order. */
export interface ReceivedBatch {
  topic: string;
  partition: number;
  messages: readonly ReceivedMessage[];
  /** False once the partition was revoked or the consumer is stopping: stop and commit nothing. */
  isActive(): boolean;
  /** Tells the group coordinator this consumer is alive during a long batch. */
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
  /**
   * Resolves once consuming has started: while the broker cannot be reached it waits (capped
   * backoff; a configuration error is thrown), and stop() ends that wait. A topic that does
   * not exist is a TopicMissingError (code `topic_missing`), thrown at once, unless the
   * subscriber was made with `createTopics`.
   */
  run(eachBatch: (batch: ReceivedBatch) => Promise<void>): Promise<void>;
  /** True while run() waits for a broker that has not answered yet. */
  waiting(): boolean;
  /** Commits `nextOffset` (the offset of the next message to read) for one partition. */
  commit(topic: string, partition: number, nextOffset: string): Promise<void>;
  /** Stops consuming and leaves the group; ends a run() still waiting for the broker. */
  stop(): Promise<void>;
}

/** What createKafkaSubscriber takes. */
export interface KafkaSubscriberOptions {
  /** Bootstrap brokers, `host:port` each. */
  brokers: string[];
  /** The consumer group (the inbox consumer's `groupId`). */
  groupId: string;
  /** Topics to read. */
  topics: string[];
  /** The Kafka client id (default `cairn-inbox-<groupId>`). */
  clientId?: string;
  /** A new group starts at the beginning of each partition instead of its end. */
  fromBeginning?: boolean;
  /** The group's session timeout: how soon a dead consumer's partitions move to another. */
  sessionTimeoutMs?: number;
  /**
   * Create the topics that do not exist yet, with these settings, before subscribing.
   * Without it a missing topic is a TopicMissingError naming it.
   */
  createTopics?: CreateTopicsOptions;
  /** Told when the client crashed for good and is being replaced (see run()). */
  onRestart?: (error: Error, attempt: number) => void;
  logger?: Logger;
  /** The Kafka client underneath (default: CAIRN_KAFKA_CLIENT, else `kafkajs`). */
  client?: KafkaClientName;
}

const KafkaSubscriberOptionsSchema = optionsSchema<KafkaSubscriberOptions>()(
  z.strictObject({
    brokers: z.array(opt.text()).min(1, 'must name at least one broker (host:port)'),
    groupId: opt.text(),
    topics: z.array(opt.text()).min(1, 'must name at least one topic'),
    clientId: opt.text().optional(),
    fromBeginning: z.boolean().optional(),
    sessionTimeoutMs: opt.ms().optional(),
    createTopics: z
      .strictObject({
        numPartitions: z.number().int().positive(),
        replicationFactor: z.number().int().positive().optional(),
      })
      .optional(),
    onRestart: opt.fn<(error: Error, attempt: number) => void>().optional(),
    logger: opt.logger(),
    client: z.enum(kafkaClientNames).optional(),
  }),
);

/** What createKafkaSubscriber hands over to the subscriber of another client once it chose it. */
export interface ClientSubscriberOptions {
  brokers: string[];
  groupId: string;
  topics: string[];
  clientId: string;
  fromBeginning: boolean;
  sessionTimeoutMs: number;
  /** Fails fast when no broker answers; checks (or creates) the topics. */
  probe: () => Promise<void>;
  log: Logger;
}

/**
 * Makes a kafkajs Subscriber for one consumer group; nothing connects until run(), and
 * stop() closes it.
 */
export function createKafkaSubscriber(options: KafkaSubscriberOptions): Subscriber {
  const opts = parseOptions('Kafka subscriber options', KafkaSubscriberOptionsSchema, options);
  const { createTopics } = opts;
  const client = opts.client ?? defaultKafkaClient();
  const clientId = opts.clientId ?? `cairn-inbox-${opts.groupId}`;
  const kafka = kafkaClient(opts.brokers, clientId);
  const log = (opts.logger ?? silentLogger).child({ component: 'subscriber', group: opts.groupId });
  let consumer: Consumer | undefined;
  let stopped = false;
  let waiting = false;
  let stopWaiting = new AbortController();

  /**
   * Fails within a connection timeout when no broker answers. A kafkajs consumer's own
   * connect() retries for tens of seconds first, too long to say promptly what we wait for.
   * Then checks the topics exist (creating them with createTopics).
   */
  async function probe(): Promise<void> {
    const admin = kafkaAdminOf(client, { brokers: opts.brokers, clientId, retries: 0 });
    try {
      const created = await ensureTopics(admin, opts.topics, createTopics);
      if (created.length > 0) log.info({ topics: created, ...createTopics }, 'created missing topics');
    } finally {
      await admin.close().catch(() => {});
    }
  }

  if (client === 'confluent') {
    // The topic check goes through the admin (kafkaAdminOf); consuming and committing are
    // librdkafka's. The module is imported at run(): without it, a ConfigurationError says
    // how to install it.
    return createConfluentSubscriber({
      brokers: opts.brokers,
      groupId: opts.groupId,
      topics: opts.topics,
      clientId: opts.clientId ?? `cairn-inbox-${opts.groupId}`,
      fromBeginning: opts.fromBeginning ?? true,
      sessionTimeoutMs: opts.sessionTimeoutMs ?? 10_000,
      probe,
      log,
    });
  }
  if (client === 'platformatic') {
    return createPlatformaticSubscriber({
      brokers: opts.brokers,
      groupId: opts.groupId,
      topics: opts.topics,
      clientId,
      fromBeginning: opts.fromBeginning ?? true,
      sessionTimeoutMs: opts.sessionTimeoutMs ?? 10_000,
      probe,
      ...(opts.onRestart ? { onRestart: opts.onRestart } : {}),
      log,
    });
  }

  /**
   * Connects, subscribes and starts one kafkajs consumer; resolves with a promise of its crash
   * (in an object: an async function returning a bare promise would wait for the crash).
   */
  async function start(
    eachBatch: (batch: ReceivedBatch) => Promise<void>,
  ): Promise<{ crashed: Promise<Error> }> {
    const c = kafka.consumer({
      groupId: opts.groupId,
      sessionTimeout: opts.sessionTimeoutMs ?? 10_000,
      heartbeatInterval: 1000,
      maxWaitTimeInMs: 100,
      retry: { retries: 10, initialRetryTime: 200, maxRetryTime: 3000 },
    });
    consumer = c;
    // kafkajs restarts itself after retriable errors only; after some others (a broker
    // restart can cause them: tulios/kafkajs#1466) it stops for good and says so here.
    const crashed = new Promise<Error>((resolve) => {
      c.on(c.events.CRASH, (e) => {
        if (!e.payload.restart) resolve(e.payload.error);
      });
    });
    await c.connect();
    await c.subscribe({ topics: opts.topics, fromBeginning: opts.fromBeginning ?? true });
    await c.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      partitionsConsumedConcurrently: 3,
      eachBatch: async ({ batch, isRunning, isStale, heartbeat, resolveOffset }) => {
        await eachBatch({
          topic: batch.topic,
          partition: batch.partition,
          messages: batch.messages.map((m) => {
            const headers: Record<string, string> = {};
            const raw = m.headers ?? {};
            // for...in: no [key, value] array per header per message (Object.entries made them).
            for (const k in raw) {
              const v = raw[k];
              if (v !== undefined) headers[k] = Array.isArray(v) ? String(v[0]) : String(v);
            }
            return {
              topic: batch.topic,
              partition: batch.partition,
              offset: m.offset,
              key: m.key?.toString() ?? null,
              value: m.value,
              headers,
              // Absent in old message formats; -1 is Kafka's "no timestamp".
              ...(Number(m.timestamp) > 0 ? { timestamp: Number(m.timestamp) } : {}),
            };
          }),
          isActive: () => isRunning() && !isStale(),
          heartbeat,
          resolveOffset,
        });
      },
    });
    return { crashed };
  }

  return {
    /**
     * Resolves once consuming has started. If the client later crashes for good, it is
     * replaced by a new one (capped backoff) until stop(): a consumer that silently stopped
     * would leave its partitions unread while the process looked healthy (seen in the chaos
     * soak: agents exited with code 0 after a broker restart).
     */
    async run(eachBatch) {
      stopped = false;
      stopWaiting = new AbortController();
      let crashed: Promise<Error> | undefined;
      const started = await startWhenReachable({
        brokers: opts.brokers,
        log,
        signal: stopWaiting.signal,
        probe,
        start: async () => {
          ({ crashed } = await start(eachBatch));
        },
        close: async () => {
          await consumer?.disconnect().catch(() => {});
        },
        waiting: (w) => {
          waiting = w;
        },
      });
      if (started === 'stopped' || !crashed) return;
      if (stopped) {
        // stop() came while the last attempt was connecting: it found no consumer to stop.
        await consumer?.disconnect().catch(() => {});
        consumer = undefined;
        return;
      }
      void (async () => {
        for (let attempt = 1; ; attempt++) {
          const error = await crashed!;
          if (stopped) return;
          opts.onRestart?.(error, attempt);
          await consumer?.disconnect().catch(() => {});
          for (;;) {
            await new Promise((r) => setTimeout(r, Math.min(10_000, 250 * 2 ** Math.min(attempt, 6))));
            if (stopped) return;
            try {
              ({ crashed } = await start(eachBatch));
              break;
            } catch (err) {
              opts.onRestart?.(err as Error, ++attempt);
              await consumer?.disconnect().catch(() => {});
            }
          }
        }
      })();
    },
    async commit(topic, partition, nextOffset) {
      await consumer?.commitOffsets([{ topic, partition, offset: nextOffset }]);
    },
    waiting: () => waiting,
    async stop() {
      stopped = true;
      stopWaiting.abort();
      await consumer?.disconnect();
      consumer = undefined;
    },
  };
}
