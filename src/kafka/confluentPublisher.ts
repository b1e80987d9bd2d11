import { CairnError, CairnErrorCodes } from '../errors.js';
import {
  type DeliveryReport,
  loadConfluent,
  type RdKafkaError,
  type RdKafkaProducer,
} from './confluentModule.js';
import type { Publisher, PublishMessage } from './publisher.js';

/** How long a message may wait for the broker, retries included, before its send fails. */
const MESSAGE_TIMEOUT_MS = 15_000;

/** One publish(): settled once every message of it has its delivery report. */
interface PendingSend {
  waiting: number;
  delivered: number;
  firstError: RdKafkaError | undefined;
  settle: () => void;
}

/**
 * A Publisher on @confluentinc/kafka-javascript (librdkafka), through its node-rdkafka API
 * rather than its KafkaJS-like one: that one cannot bound connect(), and rejects a send at its
 * first failed message while the others are still queued. Guarantees as the kafkajs one:
 *
 * - an idempotent producer (librdkafka forces acks=all and keeps each partition's order
 *   through retries with sequence numbers, up to 5 requests in flight);
 * - librdkafka's `murmur2_random` partitioner, the Java client's murmur2 for keyed messages
 *   (test/foundation/confluentPartition.int.test.ts checks it against ./keyPartition.ts);
 * - a send counts only when every message has a delivery report without error: librdkafka
 *   reports each message on its own, so no partition can be skipped silently (the kafkajs bug
 *   of ./acknowledgements.ts). A send settles only once all of its messages were reported, so
 *   a retried batch never overtakes messages of the failed one still in librdkafka's queue.
 */
export function createConfluentPublisher(opts: {
  brokers: string[];
  clientId: string;
  compression?: boolean;
}): Publisher {
  const address = opts.brokers.join(',');
  let producer: RdKafkaProducer | undefined;
  /** Between connect() and disconnect(): publish() may (re)open the producer. */
  let wanted = false;
  let opening: Promise<RdKafkaProducer> | undefined;
  const notConnected = () =>
    new CairnError(
      CairnErrorCodes.NotConnected,
      `publisher to ${address} is not connected: call connect() before publish()`,
    );

  function open(): Promise<RdKafkaProducer> {
    opening ??= openOnce().finally(() => {
      opening = undefined;
    });
    return opening;
  }

  async function openOnce(): Promise<RdKafkaProducer> {
    const previous = producer;
    producer = undefined;
    if (previous) await close(previous);
    const { Producer } = await loadConfluent();
    const next = new Producer({
      'bootstrap.servers': address,
      'client.id': opts.clientId,
      'enable.idempotence': true,
      acks: 'all',
      partitioner: 'murmur2_random',
      'allow.auto.create.topics': true,
      dr_cb: true,
      // How long a message may wait for the broker, retries included: past it the send fails
      // and the relay retries the batch (kafkajs gives up after 3 retries and a 15 s request).
      'message.timeout.ms': MESSAGE_TIMEOUT_MS,
      'socket.connection.setup.timeout.ms': 3000,
      ...(opts.compression ? { 'compression.codec': 'gzip' } : {}),
      log_level: 0,
    });
    next.on('delivery-report', onDelivery);
    // librdkafka reconnects by itself; its errors are also in the delivery reports.
    next.on('event.error', () => {});
    await new Promise<void>((resolve, reject) => {
      // Fails when no broker answered a metadata request within the timeout.
      next.connect({ timeout: 5000 }, (err) => (err ? reject(err) : resolve()));
    }).catch(async (err: unknown) => {
      await close(next);
      throw err;
    });
    next.setPollInBackground(true);
    if (!wanted) {
      await close(next);
      throw notConnected();
    }
    producer = next;
    return next;
  }

  function close(p: RdKafkaProducer): Promise<void> {
    return new Promise<void>((resolve) => p.disconnect(5000, () => resolve()));
  }

  function onDelivery(err: RdKafkaError | null, report: DeliveryReport): void {
    const send = report.opaque as PendingSend;
    if (err) send.firstError ??= err;
    else send.delivered++;
    if (--send.waiting === 0) send.settle();
  }

  return {
    address,
    async connect() {
      wanted = true;
      if (producer) return;
      await open();
    },
    async publish(messages: readonly PublishMessage[]) {
      if (!wanted) throw notConnected();
      if (messages.length === 0) return;
      // A connect() that failed (the broker was down) leaves no producer: connecting again
      // here sends once the broker is back, as the kafkajs publisher does.
      const p = producer ?? (await open());
      let settle!: () => void;
      const done = new Promise<void>((r) => {
        settle = r;
      });
      const send: PendingSend = { waiting: 0, delivered: 0, firstError: undefined, settle };
      let refused: unknown;
      for (const m of messages) {
        const headers = Object.entries(m.headers).map(([k, v]) => ({ [k]: v }));
        try {
          p.produce(m.topic, -1, m.value, m.key, 0, send, headers);
          send.waiting++;
        } catch (err) {
          // Refused before sending (too large for message.max.bytes, queue full): the messages
          // already queued are still reported; the send fails with this error once they are.
          refused = err;
          break;
        }
      }
      if (send.waiting > 0) {
        // The batch is complete: send it now rather than after linger.ms (librdkafka's flush
        // ignores linger). Measured with the relay bench (20,000 messages, --quick sizes): commit
        // to ack at 1,000/s p50 4.6 ms, p99 16.5 ms against 13.7 and 33.3 ms without it, and 21
        // against 28 µs of Node CPU a message draining; linger.ms 0 instead split each batch
        // into small requests (drain 26 µs of Node, 4.5 of broker against 2). flush() holds a
        // libuv pool thread until everything queued is reported; the delivery reports, not its
        // outcome, settle the send.
        p.flush(MESSAGE_TIMEOUT_MS + 5000, () => {});
        await done;
      }
      const failure = refused ?? send.firstError;
      if (failure) throw failure;
      const { delivered } = send;
      if (delivered !== messages.length) {
        throw new CairnError(
          CairnErrorCodes.PublishFailed,
          `@confluentinc/kafka-javascript reported ${delivered} of ${messages.length} messages sent to ${address} ` +
            'as delivered: the others may never have been written; send the batch again',
          { retriable: true },
        );
      }
    },
    async disconnect() {
      wanted = false;
      const p = producer;
      producer = undefined;
      if (p) await close(p);
    },
  };
}
