import { type Link, otel, spanContextFromHeaders, withSpan } from '../src/tracing/otel.js';
import type { Ready } from './publishBatch.js';

/** What the relay observes for its histograms, once per batch the broker acknowledged. */
export interface RelayObservation {
  /** Messages in the batch. */
  batchSize: number;
  /** Per message: from the outbox row's created_at (database clock) to the broker's ack, in seconds. */
  commitToPublishSeconds: number[];
}

/**
 * Runs `publish` for one batch inside a PRODUCER span, `send <topic>` (`send` when the batch
 * spans topics), with messaging attributes and a link to each message's origin (the span
 * that enqueued it, from its `traceparent`). When every origin is in one trace, the span is
 * a child of the first, so a lone task update yields one connected trace; otherwise it starts
 * its own trace and the links connect it.
 */
export function inPublishSpan(batch: readonly Ready[], publish: () => Promise<void>): Promise<void> {
  if (!otel || batch.length === 0) return publish();
  const topics = new Set(batch.map((b) => b.message.topic));
  const topic = topics.size === 1 ? batch[0]!.message.topic : undefined;
  const links: Link[] = [];
  for (const b of batch) {
    const h = b.message.headers;
    const sc = spanContextFromHeaders(h.traceparent, h.tracestate);
    if (sc) links.push({ context: sc });
  }
  const oneTrace = links.length > 0 && links.every((l) => l.context.traceId === links[0]!.context.traceId);
  return withSpan(
    topic ? `send ${topic}` : 'send',
    {
      kind: 'producer',
      attributes: {
        'messaging.system': 'kafka',
        'messaging.operation.type': 'send',
        'messaging.operation.name': 'send',
        'messaging.destination.name': topic,
        'messaging.batch.message_count': batch.length,
      },
      links,
      ...(oneTrace ? { parent: otel.trace.setSpanContext(otel.ROOT_CONTEXT, links[0]!.context) } : {}),
    },
    publish,
  );
}

/** The observation of a batch acknowledged at `ackedAt` (ms since the epoch). */
export function observeBatch(batch: readonly Ready[], ackedAt: number): RelayObservation {
  return {
    batchSize: batch.length,
    commitToPublishSeconds: batch.map((b) => Math.max(0, ackedAt - b.row.created_at.getTime()) / 1000),
  };
}
