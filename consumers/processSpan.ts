import { type Observations, observations, withObservations } from '../src/metrics/observations.js';
import { contextFromHeaders, noTracerRegistered, otel, withSpan } from '../src/tracing/otel.js';
import type { InboxMessage } from './inboxMessage.js';

/** What an inbox consumer observes for its histograms, once per message its handler applied. */
export interface InboxObservation {
  /** From the Kafka record's timestamp to the handler's completion, in seconds. */
  publishToApplySeconds: number;
}

/** The tracing and latency observation of one inbox consumer's handler calls. */
export interface ApplyTracing {
  /**
   * Runs the handler for `m` inside a CONSUMER span `process <topic>`, a child of the span
   * that enqueued the message (its `traceparent` header), so spans the handler starts join
   * the message's trace; then reports the message's publish-to-apply latency.
   */
  run(m: InboxMessage, handle: () => Promise<void>): Promise<number | undefined>;
  /**
   * True when `m` needs no span (see run): the caller then awaits its handler itself and takes
   * `observe(m)`, without run's closure and promise per message.
   */
  bare(m: InboxMessage): boolean;
  /** The publish-to-apply latency to report for `m` (once committed); undefined when nobody listens. */
  observe(m: InboxMessage): number | undefined;
  /** Reports the publish-to-apply latencies `run` returned, once their transaction committed. */
  committed(latencies: readonly number[]): void;
  readonly observed: Observations<InboxObservation>;
  /** Makes the consumer's observations findable by inboxMetrics; returns the consumer. */
  attach<T extends object>(consumer: T): T;
}

export function applyTracing(groupId: string): ApplyTracing {
  const observed = observations<InboxObservation>();
  /** Seconds from the record's timestamp to now; undefined without a usable one (absent, -1 for "none"). */
  const latency = (m: InboxMessage) =>
    m.timestamp !== undefined && Number.isFinite(m.timestamp) && m.timestamp > 0
      ? Math.max(0, Date.now() - m.timestamp) / 1000
      : undefined;
  // Without an SDK and without a traceparent, the no-op span would only carry the active
  // context, which the handler runs in anyway: skipped, it saves ~2 µs of Node per message
  // (bench/inbox.ts, same run). With a traceparent the span still carries the message's
  // trace to what the handler enqueues, SDK or not.
  const bare = (m: InboxMessage) => !otel || (!m.headers.traceparent && noTracerRegistered());
  const observe = (m: InboxMessage) => (observed.listening ? latency(m) : undefined);
  return {
    bare,
    observe,
    async run(m, handle) {
      if (bare(m)) {
        await handle();
      } else {
        const parent = contextFromHeaders(m.headers.traceparent, m.headers.tracestate);
        await withSpan(
          `process ${m.topic}`,
          {
            kind: 'consumer',
            attributes: {
              'messaging.system': 'kafka',
              'messaging.operation.type': 'process',
              'messaging.operation.name': 'process',
              'messaging.destination.name': m.topic,
              'messaging.destination.partition.id': String(m.partition),
              'messaging.consumer.group.name': groupId,
              'messaging.message.id': m.messageId,
              'messaging.kafka.message.key': m.key ?? undefined,
              'messaging.kafka.offset': Number(m.offset),
            },
            ...(parent ? { parent } : {}),
          },
          handle,
        );
      }
      return observe(m);
    },
    committed(latencies) {
      // Only now: a chunk that rolled back and was applied again one by one counts each message once.
      for (const seconds of latencies) {
        try {
          observed.emit({ publishToApplySeconds: seconds });
        } catch {
          // a metrics listener's failure must not touch a committed transaction's outcome
        }
      }
    },
    observed,
    attach: (consumer) => withObservations(consumer, observed),
  };
}
