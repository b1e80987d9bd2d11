import { CompressionTypes, Kafka, type KafkaConfig, logLevel, Partitioners, type Producer } from 'kafkajs';
import { z } from 'zod';
import { CairnError, CairnErrorCodes } from '../errors.js';
import { opt, optionsSchema, parseOptions } from '../options.js';
import { recordingPartitioner, type SentPartition, unacknowledgedPartitions } from './acknowledgements.js';
import { isPoisonError } from './classifyError.js';
import { defaultKafkaClient, type KafkaClientName, kafkaClientNames } from './clientChoice.js';
import { createConfluentPublisher } from './confluentPublisher.js';
import { sortRefusal } from './partlyPublished.js';
import { createPlatformaticPublisher } from './platformaticPublisher.js';

/** One message to publish: topic, key, bytes and headers. */
export interface PublishMessage {
  topic: string;
  key: string;
  value: Buffer;
  headers: Record<string, string>;
}

/**
 * What the relay needs from a Kafka client. kafkajs is in maintenance mode; keeping the
 * relay behind this interface lets another client replace it without touching the relay.
 */
export interface Publisher {
  /** Where it connects (the bootstrap brokers), for log lines. */
  readonly address: string;
  /** Connects to the brokers (again, after disconnect()). */
  connect(): Promise<void>;
  /**
   * Resolves once the broker acknowledged every message (acks=all), in order per partition.
   * When the broker refused some messages for good and wrote others, rejects with a
   * PartlyPublishedError (./partlyPublished.ts) that names the ones it has.
   */
  publish(messages: readonly PublishMessage[]): Promise<void>;
  /** Closes the connection; connect() may be called again. */
  disconnect(): Promise<void>;
}

export function kafkaClient(brokers: string[], clientId: string, extra: Partial<KafkaConfig> = {}): Kafka {
  return new Kafka({
    clientId,
    brokers,
    logLevel: logLevel.NOTHING,
    connectionTimeout: 3000,
    requestTimeout: 15000,
    retry: { retries: 2, initialRetryTime: 100, maxRetryTime: 1000 },
    ...extra,
  });
}

/**
 * Idempotent producer, acks=all, one request in flight: with kafkajs this is what keeps a
 * partition's order through retries.
 */
/** What createKafkaPublisher takes. */
export interface KafkaPublisherOptions {
  /** Bootstrap brokers, `host:port` each. */
  brokers: string[];
  /** The Kafka client id (default `cairn-relay`). */
  clientId?: string;
  /** Gzip each batch. */
  compression?: boolean;
  /** The Kafka client underneath (default: CAIRN_KAFKA_CLIENT, else `kafkajs`). */
  client?: KafkaClientName;
}

const KafkaPublisherOptionsSchema = optionsSchema<KafkaPublisherOptions>()(
  z.strictObject({
    brokers: z.array(opt.text()).min(1, 'must name at least one broker (host:port)'),
    clientId: opt.text().optional(),
    compression: z.boolean().optional(),
    client: z.enum(kafkaClientNames).optional(),
  }),
);

/**
 * Makes a kafkajs Publisher (idempotent producer, acks=all); nothing connects until
 * connect(), and disconnect() closes it.
 */
export function createKafkaPublisher(options: KafkaPublisherOptions): Publisher {
  const opts = parseOptions('Kafka publisher options', KafkaPublisherOptionsSchema, options);
  const client = opts.client ?? defaultKafkaClient();
  if (client === 'confluent') {
    // The module is imported at connect(): without it, a ConfigurationError says how to install it.
    return createConfluentPublisher({
      brokers: opts.brokers,
      clientId: opts.clientId ?? 'cairn-relay',
      ...(opts.compression ? { compression: true } : {}),
    });
  }
  if (client === 'platformatic') {
    return createPlatformaticPublisher({
      brokers: opts.brokers,
      clientId: opts.clientId ?? 'cairn-relay',
      ...(opts.compression ? { compression: true } : {}),
    });
  }
  const kafka = kafkaClient(opts.brokers, opts.clientId ?? 'cairn-relay');
  let producer: Producer | undefined;
  /**
   * The partition kafkajs chose for each message object of the sends in flight, removed once
   * its send is over. A WeakMap of them cost 0.45-2.2 µs per message (its table grows between
   * collections; a microbenchmark of 2,500-message batches), a Map's set and delete about 0.1.
   */
  const partitionOf = new Map<object, number>();
  /** False after a connect() that failed: such a producer only answers "The producer is disconnected". */
  let connected = false;
  /** The connect in flight: concurrent callers share it, so one producer is ever open. */
  let opening: Promise<Producer> | undefined;
  function open(): Promise<Producer> {
    opening ??= (async () => {
      try {
        // The previous producer (connected or not) is closed before a new one replaces it.
        const previous = producer;
        producer = undefined;
        connected = false;
        await previous?.disconnect().catch(() => {});
        const next = kafka.producer({
          idempotent: true,
          maxInFlightRequests: 1,
          allowAutoTopicCreation: true,
          createPartitioner: recordingPartitioner(Partitioners.DefaultPartitioner, partitionOf),
          retry: { retries: 3, initialRetryTime: 100, maxRetryTime: 2000 },
        });
        producer = next;
        await next.connect();
        if (producer !== next) {
          // disconnect() ran meanwhile: this producer is not wanted any more.
          await next.disconnect().catch(() => {});
          throw notConnected();
        }
        connected = true;
        return next;
      } finally {
        opening = undefined;
      }
    })();
    return opening;
  }
  const notConnected = () =>
    new CairnError(
      CairnErrorCodes.NotConnected,
      `publisher to ${opts.brokers.join(',')} is not connected: call connect() before publish()`,
    );
  async function send(
    p: Producer,
    topicMessages: Array<{ topic: string; messages: PublishMessage[] }>,
  ): Promise<void> {
    const acks = await p.sendBatch({
      acks: -1,
      ...(opts.compression ? { compression: CompressionTypes.GZIP } : {}),
      topicMessages,
    });
    // kafkajs may resolve a send that never reached a partition whose leader moved during its
    // retries (see ./acknowledgements.ts): only every partition's own answer counts. The
    // partitions written to, once each (a handful per batch, not one entry per message).
    const sent: SentPartition[] = [];
    for (const { topic, messages: ms } of topicMessages) {
      const partitions = new Set<number>();
      for (const m of ms) partitions.add(partitionOf.get(m) ?? -1);
      for (const partition of partitions) sent.push({ topic, partition });
    }
    const missing = unacknowledgedPartitions(sent, acks);
    if (missing.length > 0) {
      throw new CairnError(
        CairnErrorCodes.PublishFailed,
        `kafkajs resolved a send to ${opts.brokers.join(',')} without an acknowledgement from ` +
          `${missing.map((m) => `${m.topic}/${m.partition}`).join(', ')} (a partition leader moved ` +
          'during its retries): those messages may never have been written; send the batch again',
        { retriable: true },
      );
    }
  }
  return {
    address: opts.brokers.join(','),
    async connect() {
      if (connected && producer) return;
      await open();
    },
    async publish(messages) {
      if (!producer && !opening) throw notConnected();
      // The relay reconnects after a failed batch; when the broker was still down, the next
      // batch spent every retry (about 10 s after a broker restart in the chaos soak) on a
      // producer that never connected. Connecting again on each retry sends once it is back.
      const p = connected && producer ? producer : await open();
      // The messages go to kafkajs as they are (it reads key, value, headers and ignores topic):
      // a copy of each was 2,500 objects per batch for the collector.
      const byTopic = new Map<string, PublishMessage[]>();
      for (const m of messages) {
        const list = byTopic.get(m.topic);
        if (list) list.push(m);
        else byTopic.set(m.topic, [m]);
      }
      const topicMessages = [...byTopic].map(([topic, list]) => ({ topic, messages: list }));
      try {
        await send(p, topicMessages);
      } catch (err) {
        if (!isPoisonError(err)) throw err;
        throw await sortRefusal(err, topicMessages, partitionOf, (tm) => send(p, tm));
      } finally {
        for (const m of messages) partitionOf.delete(m);
      }
    },
    async disconnect() {
      const p = producer;
      producer = undefined;
      connected = false;
      await p?.disconnect();
    },
  };
}
