import { type Observations, observations, withObservations } from '../src/metrics/observations.js';
import { contextFromHeaders, otel, withSpan } from '../src/tracing/otel.js';
import type { InboxMessage } from './inboxConsumer.js';

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
  run(m: InboxMessage, handle: () => Promise<void>): Promise<void>;
  readonly observed: Observations<InboxObservation>;
  /** Makes the consumer's observations findable by inboxMetrics; returns the consumer. */
  attach<T extends object>(consumer: T): T;
}

export function applyTracing(groupId: string): ApplyTracing {
  const observed = observations<InboxObservation>();
  const report = (m: InboxMessage) => {
    if (m.timestamp === undefined || !Number.isFinite(m.timestamp)) return;
    observed.emit({ publishToApplySeconds: Math.max(0, Date.now() - m.timestamp) / 1000 });
  };
  return {
    async run(m, handle) {
      if (!otel) {
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
      report(m);
    },
    observed,
    attach: (consumer) => withObservations(consumer, observed),
  };
}
