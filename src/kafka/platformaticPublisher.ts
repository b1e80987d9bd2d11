import {
  CompressionAlgorithms,
  type MessageToProduce,
  Producer,
  stringSerializer,
} from '@platformatic/kafka';
import { CairnError, CairnErrorCodes } from '../errors.js';
import { isPoisonError } from './classifyError.js';
import { keyHash } from './keyPartition.js';
import { PartlyPublishedError } from './partlyPublished.js';
import type { Publisher, PublishMessage } from './publisher.js';

/**
 * The key hash the partitioner computed, on the message object publish() made for send(). A
 * WeakMap of them cost 0.45-2.2 µs per message (its table grows between collections: a
 * microbenchmark of 2,500-message batches; 6% of a WAL relay's drain, profiled), the property
 * a few ns. A symbol: not a field the client reads or validates.
 */
const HASH = Symbol('cairn.keyHash');
type Message = MessageToProduce<string, Buffer, string, string> & { [HASH]?: number };

/**
 * A Publisher on @platformatic/kafka with the guarantees of the kafkajs one: an idempotent
 * producer (the client then forces acks=all and one request in flight per connection), keys
 * placed on the partition kafkajs and the Java client choose (./keyPartition.ts), and a send
 * that counts only when every partition it wrote to answered.
 */
export function createPlatformaticPublisher(opts: {
  brokers: string[];
  clientId: string;
  compression?: boolean;
}): Publisher {
  let producer: Producer<string, Buffer, string, string> | undefined;

  const notConnected = () =>
    new CairnError(
      CairnErrorCodes.NotConnected,
      `publisher to ${opts.brokers.join(',')} is not connected: call connect() before publish()`,
    );
  /** Between connect() and disconnect(): publish() may (re)open the producer. */
  let wanted = false;
  /** The open in flight: concurrent callers share it, so one producer is ever open. */
  let opening: Promise<NonNullable<typeof producer>> | undefined;
  function open(): Promise<NonNullable<typeof producer>> {
    opening ??= openOnce().finally(() => {
      opening = undefined;
    });
    return opening;
  }
  /** Opens a producer and asks for metadata, so that it fails when no broker answers. */
  async function openOnce(): Promise<NonNullable<typeof producer>> {
    const previous = producer;
    await previous?.close().catch(() => {});
    const next = create();
    producer = next;
    try {
      await next.metadata({ topics: [] });
      return next;
    } catch (err) {
      if (producer === next) producer = undefined;
      await next.close().catch(() => {});
      throw err;
    }
  }
  const create = () =>
    new Producer<string, Buffer, string, string>({
      clientId: opts.clientId,
      bootstrapBrokers: opts.brokers,
      idempotent: true,
      acks: -1,
      autocreateTopics: true,
      // An idempotent producer otherwise retries without end (retries: MAX_SAFE_INTEGER): a
      // broker that is down must fail the send so the relay can say so and retry the batch.
      retries: 3,
      retryDelay: (_client, _op, attempt) => Math.min(2000, 100 * 2 ** attempt),
      connectTimeout: 3000,
      timeout: 15_000,
      serializers: { key: stringSerializer, headerKey: stringSerializer, headerValue: stringSerializer },
      // The client takes the result modulo the partition count: the Java client's choice.
      partitioner: (message: Message, key) => {
        const h = key ? keyHash(key) : 0;
        message[HASH] = h;
        return h;
      },
      ...(opts.compression ? { compression: CompressionAlgorithms.GZIP } : {}),
    });
  return {
    address: opts.brokers.join(','),
    async connect() {
      wanted = true;
      if (producer && !producer.closed) return;
      await open();
    },
    async publish(messages) {
      if (!wanted) throw notConnected();
      // A connect() that failed (the broker was down) leaves no producer: connecting again
      // here sends once the broker is back, as the kafkajs publisher does.
      const p = producer && !producer.closed ? producer : await open();
      const out: Message[] = messages.map((m: PublishMessage) => ({
        topic: m.topic,
        key: m.key,
        value: m.value,
        headers: m.headers,
      }));
      const partitionOf = (m: Message) => {
        const count = p.currentMetadata?.topics.get(m.topic)?.partitionsCount;
        const hash = m[HASH];
        return count && hash !== undefined ? `${m.topic}\u0000${hash % count}` : `${m.topic}\u0000?`;
      };
      let result: Awaited<ReturnType<typeof p.send>>;
      try {
        result = await p.send({ messages: out });
      } catch (err) {
        // The broker refused some partitions of a request and wrote the others: those are
        // named, not sent again (the isolation would write them twice).
        const written = isPoisonError(err) ? writtenPartitions(err) : undefined;
        const acknowledged = new Set(
          written ? messages.filter((_, i) => written.has(partitionOf(out[i]!))) : [],
        );
        throw acknowledged.size > 0 ? new PartlyPublishedError(acknowledged, err) : err;
      }
      // Every partition written to must have answered (see ./acknowledgements.ts for the
      // kafkajs bug that made this check necessary; here it guards the same promise).
      const acked = new Set((result.offsets ?? []).map((o) => `${o.topic}\u0000${o.partition}`));
      const missing = new Set<string>();
      for (const m of out) {
        const k = partitionOf(m);
        if (!acked.has(k)) missing.add(k.replace('\u0000', '/'));
      }
      if (missing.size > 0) {
        throw new CairnError(
          CairnErrorCodes.PublishFailed,
          `@platformatic/kafka resolved a send to ${opts.brokers.join(',')} without an acknowledgement from ` +
            `${[...missing].join(', ')}: those messages may never have been written; send the batch again`,
          { retriable: true },
        );
      }
    },
    async disconnect() {
      wanted = false;
      const p = producer;
      producer = undefined;
      await p?.close();
    },
  };
}

/**
 * The partitions a failed send wrote: @platformatic/kafka throws one AggregateError for the
 * send, holding each broker's refused response, whose partitions answered one by one (error
 * code 0: written), and `produced` with the offsets of the requests that went through.
 */
function writtenPartitions(err: unknown): Set<string> {
  const written = new Set<string>();
  const e = err as {
    errors?: Array<{
      response?: {
        responses?: Array<{
          name?: string;
          partitionResponses?: Array<{ index: number; errorCode: number }>;
        }>;
      };
    }>;
    produced?: { offsets?: Array<{ topic: string; partition: number }> };
  };
  for (const o of e.produced?.offsets ?? []) written.add(`${o.topic}\u0000${o.partition}`);
  for (const inner of e.errors ?? []) {
    for (const r of inner?.response?.responses ?? []) {
      for (const pr of r.partitionResponses ?? []) {
        if (pr.errorCode === 0 && r.name !== undefined) written.add(`${r.name}\u0000${pr.index}`);
      }
    }
  }
  return written;
}
