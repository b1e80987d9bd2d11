import { context, type Span, SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { inboxMetrics } from '../../consumers/metrics.js';
import { relayMetrics } from '../../relay/metrics.js';
import { createRelay } from '../../relay/relay.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask, planApproved } from '../state/fixtures.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const contextManager = new AsyncLocalStorageContextManager();
let tdb: TestDatabase;

beforeAll(async () => {
  context.setGlobalContextManager(contextManager.enable());
  trace.setGlobalTracerProvider(provider);
  tdb = await createTestDatabase('tracing');
});
afterAll(async () => {
  await tdb?.drop();
  await provider.shutdown();
  trace.disable();
  context.disable();
});

const parentOf = (s: ReadableSpan) => s.parentSpanContext?.spanId;
const only = (name: string) => {
  const found = exporter.getFinishedSpans().filter((s) => s.name === name);
  expect(found, `spans named ${name}`).toHaveLength(1);
  return found[0]!;
};

describe('one task update through the relay and an inbox consumer is one trace', () => {
  it("update -> process -> handler share one trace id, the relay's send is linked to it, and the Kafka record carries it", async () => {
    const topic = await createTestTopic('traced', 1);
    const groupId = `traced-${topic}`;
    const store = createTaskStore({ db: tdb.db });
    await store.create({ task: newTask('traced'), actor: AGENT });

    const tracer = trace.getTracer('test');
    let stepSpan: Span | undefined;
    const r = await tracer.startActiveSpan('agent.step', async (span) => {
      stepSpan = span;
      try {
        return await store.update({
          taskId: 'traced',
          expectedVersion: 1,
          patch: planApproved('s3://plans/1'),
          actor: AGENT,
          reason: 'plan approved',
          messages: [{ topic, payload: { secret: 'never-in-a-span' } }],
        });
      } finally {
        span.end();
      }
    });
    expect(r.ok).toBe(true);

    const relay = createRelay({ db: tdb.db, publisher: createKafkaPublisher({ brokers: kafkaBrokers() }) });
    const relayRegistry = relayMetrics(relay, tdb.db);
    const consumer = createInboxConsumer({
      db: tdb.db,
      groupId,
      subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId, topics: [topic] }),
      dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      handler: async () => {
        // A span the handler starts is a child of the consumer's process span.
        tracer.startActiveSpan('handler', (span) => span.end());
      },
    });
    const inboxRegistry = inboxMetrics(consumer, { db: tdb.db, groupId, topics: [topic] });
    const running = relay.run();
    void consumer.run();
    try {
      await waitFor('the message to be applied', () => consumer.stats().applied === 1);
    } finally {
      await consumer.stop();
      await relay.stop();
      await running;
    }

    const step = only('agent.step');
    const update = only('cairn.task.update');
    const send = only(`send ${topic}`);
    const process = only(`process ${topic}`);
    const handler = only('handler');
    const traceId = step.spanContext().traceId;
    expect(stepSpan?.spanContext().traceId).toBe(traceId);
    for (const s of [update, process, handler]) expect(s.spanContext().traceId).toBe(traceId);
    // The relay's batch span is a root of its own, linked to the update (a header is its writer's word).
    expect(send.spanContext().traceId).not.toBe(traceId);
    expect(send.links.map((l) => l.context.traceId)).toEqual([traceId]);

    expect(parentOf(update)).toBe(step.spanContext().spanId);
    expect(update.attributes).toMatchObject({
      'cairn.task.id': 'traced',
      'cairn.task.version': 2,
      'cairn.task.status.from': 'planning',
      'cairn.task.status.to': 'implementing',
    });

    expect(send.kind).toBe(SpanKind.PRODUCER);
    expect(parentOf(send)).toBeUndefined();
    expect(send.links.map((l) => l.context.spanId)).toEqual([update.spanContext().spanId]);
    expect(send.attributes).toMatchObject({
      'messaging.system': 'kafka',
      'messaging.operation.type': 'send',
      'messaging.destination.name': topic,
      'messaging.batch.message_count': 1,
    });

    expect(process.kind).toBe(SpanKind.CONSUMER);
    expect(parentOf(process)).toBe(update.spanContext().spanId);
    expect(process.attributes).toMatchObject({
      'messaging.system': 'kafka',
      'messaging.destination.name': topic,
      'messaging.consumer.group.name': groupId,
      'messaging.message.id': r.ok ? r.messageIds[0] : undefined,
      'messaging.kafka.message.key': 'traced',
    });
    expect(parentOf(handler)).toBe(process.spanContext().spanId);

    // No payload in any span.
    const everything = JSON.stringify(exporter.getFinishedSpans().map((s) => s.attributes));
    expect(everything).not.toContain('never-in-a-span');

    // Across processes: what crosses is the record, and its traceparent names the update span.
    const [record] = await readTopic(
      kafkaClient(kafkaBrokers(), 'trace-reader'),
      topic,
      (m) => m.length >= 1,
    );
    expect(record?.headers.traceparent).toBe(`00-${traceId}-${update.spanContext().spanId}-01`);

    // The histograms saw the batch and the message.
    const relayText = await relayRegistry.metrics();
    expect(relayText).toContain('cairn_relay_batch_size_count 1');
    expect(relayText).toContain('cairn_relay_commit_to_publish_seconds_count 1');
    const inboxText = await inboxRegistry.metrics();
    expect(inboxText).toContain(`cairn_inbox_publish_to_apply_seconds_count{group="${groupId}"} 1`);
  });

  it('a refused update ends its span with status error and error.type = the code, never the message', async () => {
    const store = createTaskStore({ db: tdb.db });
    await store.create({ task: newTask('refused'), actor: AGENT });
    exporter.reset();
    await expect(
      store.update({
        taskId: 'refused',
        expectedVersion: 1,
        patch: { status: 'complete' },
        actor: AGENT,
        reason: 'tenant-private reason',
      }),
    ).rejects.toMatchObject({ code: 'invalid_transition' });
    const update = only('cairn.task.update');
    expect(update.status.code).toBe(SpanStatusCode.ERROR);
    expect(update.status.message).toBeUndefined();
    expect(update.attributes['error.type']).toBe('invalid_transition');
    expect(update.events).toEqual([]);
    expect(JSON.stringify(update.attributes)).not.toContain('tenant-private');
  });
});
