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
 * that enqueued it, from its `traceparent`). The span is a root of its own trace: the links
 * connect it to every message's trace (a batch mixes tenants' messages, and a header is what
 * its writer put there).
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
      // A root span, linked to each origin: the headers are the writers' (a tenant may name any
      // trace in them), so no batch, which carries many writers' messages, joins one of their traces.
      parent: otel.ROOT_CONTEXT,
    },
    publish,
  );
}

/** The observation of a batch acknowledged at `ackedAt` (ms since the epoch). */
export function observeBatch(batch: readonly Ready[], ackedAt: number): RelayObservation {
  const seconds: number[] = [];
  for (const b of batch) {
    // created_at is a column a tenant can write ('infinity', a year no Date holds): such a row
    // is published like any other and left out of the histogram.
    const at = b.row.created_ms;
    if (Number.isFinite(at)) seconds.push(Math.max(0, ackedAt - at) / 1000);
  }
  return { batchSize: batch.length, commitToPublishSeconds: seconds };
}
