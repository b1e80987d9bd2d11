import { CairnError, CairnErrorCodes } from '../errors.js';
import { type KafkaJsBatchPayload, type KafkaJsConsumer, loadConfluent } from './confluentModule.js';
import { startWhenReachable } from './startConsumer.js';
import type { ClientSubscriberOptions, ReceivedBatch, ReceivedMessage, Subscriber } from './subscriber.js';

/** What createKafkaSubscriber hands over once it chose this client. */
export type ConfluentSubscriberOptions = ClientSubscriberOptions;

/** Batches handled at once, one partition each (as the kafkajs subscriber). */
const CONCURRENT_PARTITIONS = 3;
/**
 * Messages per batch at most. The client's default is 32, which made the inbox commit a
 * transaction per 32 messages; kafkajs hands out what one fetch brought (up to 1 MB a partition).
 */
const MAX_BATCH = 1000;

/**
 * A Subscriber on @confluentinc/kafka-javascript's KafkaJS-like consumer (librdkafka underneath).
 * Its eachBatch already gives what the inbox consumer needs: per partition, batches in offset
 * order, one batch of a partition at a time, offsets that move only through commit() (auto
 * commit off; a batch's unresolved messages are read again), and isStale() once a seek or
 * revocation made the batch obsolete.
 *
 * A revocation (eager protocol) waits until the batches in progress have returned: the client
 * applies it between its fetch rounds, so a batch's own commits still count. librdkafka
 * reconnects and re-joins by itself and the client restarts its fetch loop after any error, so
 * there is no crashed client to replace here, unlike the kafkajs and platformatic subscribers.
 */
export function createConfluentSubscriber(opts: ConfluentSubscriberOptions): Subscriber {
  let consumer: KafkaJsConsumer | undefined;
  let stopped = false;
  let waiting = false;
  let stopWaiting = new AbortController();

  function toBatch(p: KafkaJsBatchPayload): ReceivedBatch {
    const { topic, partition } = p.batch;
    return {
      topic,
      partition,
      messages: p.batch.messages.map((m): ReceivedMessage => {
        const headers: Record<string, string> = {};
        for (const [k, v] of Object.entries(m.headers ?? {})) {
          if (v !== undefined) headers[k] = Array.isArray(v) ? String(v[0]) : String(v);
        }
        const timestamp = Number(m.timestamp);
        return {
          topic,
          partition,
          offset: m.offset,
          key: m.key?.toString() ?? null,
          value: m.value,
          headers,
          ...(timestamp > 0 ? { timestamp } : {}),
        };
      }),
      isActive: () => !stopped && p.isRunning() && !p.isStale(),
      heartbeat: async () => {}, // librdkafka heartbeats on its own thread
      resolveOffset: (offset) => p.resolveOffset(offset),
    };
  }

  async function start(eachBatch: (batch: ReceivedBatch) => Promise<void>): Promise<void> {
    const { KafkaJS } = await loadConfluent();
    const c = new KafkaJS.Kafka({}).consumer({
      kafkaJS: {
        brokers: opts.brokers,
        clientId: opts.clientId,
        groupId: opts.groupId,
        sessionTimeout: opts.sessionTimeoutMs,
        heartbeatInterval: 1000,
        maxWaitTimeInMs: 100,
        fromBeginning: opts.fromBeginning,
        autoCommit: false,
        logLevel: 0, // nothing: errors reach us as rejections, and the client retries the rest
      },
      'js.consumer.max.batch.size': MAX_BATCH,
    });
    consumer = c;
    await c.connect();
    await c.subscribe({ topics: opts.topics });
    await c.run({
      eachBatchAutoResolve: false,
      partitionsConsumedConcurrently: CONCURRENT_PARTITIONS,
      eachBatch: (p) => eachBatch(toBatch(p)),
    });
  }

  return {
    async run(eachBatch) {
      stopped = false;
      stopWaiting = new AbortController();
      const started = await startWhenReachable({
        brokers: opts.brokers,
        log: opts.log,
        signal: stopWaiting.signal,
        probe: opts.probe,
        start: () => start(eachBatch),
        close: async () => {
          await consumer?.disconnect().catch(() => {});
          consumer = undefined;
        },
        waiting: (w) => {
          waiting = w;
        },
      });
      if (started !== 'stopped' && stopped) {
        // stop() came while the last attempt was connecting: it found no consumer to stop.
        await consumer?.disconnect().catch(() => {});
        consumer = undefined;
      }
    },
    async commit(topic, partition, nextOffset) {
      const c = consumer;
      // The broker takes a commit for any partition from any member of the current generation:
      // one that moved to another consumer must not get ours.
      if (!c?.assignment().some((a) => a.topic === topic && a.partition === partition)) {
        throw new CairnError(
          CairnErrorCodes.NotConnected,
          `partition ${topic}/${partition} is not assigned to this consumer of group ${opts.groupId} any more: its offset is not committed`,
        );
      }
      await c.commitOffsets([{ topic, partition, offset: nextOffset }]);
    },
    waiting: () => waiting,
    async stop() {
      stopped = true;
      stopWaiting.abort();
      const c = consumer;
      consumer = undefined;
      await c?.disconnect();
    },
  };
}
