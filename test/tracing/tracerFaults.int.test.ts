import { context, type Tracer, type TracerProvider, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, type SpanProcessor } from '@opentelemetry/sdk-trace-base';
import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { inboxMetrics } from '../../consumers/metrics.js';
import { relayMetrics } from '../../relay/metrics.js';
import { createRelay } from '../../relay/relay.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { laneOf } from '../../src/outbox/lanes.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask, planApproved } from '../state/fixtures.js';
import { twoTenants } from '../support/tenants.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';

// What the review of the tracing found: the SDK and the rows' columns are other people's code
// and data. A tracer that throws (or never calls back) and an outbox row with a created_at no
// Date can hold must not change what is published, applied or committed.

let tdb: TestDatabase;
beforeAll(async () => {
  tdb = await createTestDatabase('tracer_faults');
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
});
afterEach(() => trace.disable());
afterAll(async () => {
  context.disable();
  await tdb?.drop();
});

const boom = () => {
  throw new Error('exporter bug');
};
const failing: Record<string, () => TracerProvider> = {
  'a span processor that throws in onStart': () =>
    new BasicTracerProvider({
      spanProcessors: [
        {
          onStart: boom,
          onEnd: () => {},
          forceFlush: async () => {},
          shutdown: async () => {},
        } as SpanProcessor,
      ],
    }),
  'a span processor that throws in onEnd': () =>
    new BasicTracerProvider({
      spanProcessors: [
        {
          onStart: () => {},
          onEnd: boom,
          forceFlush: async () => {},
          shutdown: async () => {},
        } as SpanProcessor,
      ],
    }),
  'a sampler that throws': () =>
    new BasicTracerProvider({ sampler: { shouldSample: boom, toString: () => 'boom' } as never }),
  'a tracer that throws on startSpan and never calls back': () => ({
    getTracer: () =>
      ({
        startSpan: boom,
        startActiveSpan: () => undefined,
      }) as unknown as Tracer,
  }),
};

describe('a tracer that fails changes nothing Cairn does', () => {
  for (const [name, provider] of Object.entries(failing)) {
    it(`${name}: the update commits and says so, the relay publishes each message once and empties the outbox, the consumer applies each once`, async () => {
      trace.setGlobalTracerProvider(provider());
      const topic = await createTestTopic('tracer-faults', 1);
      const id = `tf-${topic.slice(-8)}`;
      const store = createTaskStore({ db: tdb.db });
      await store.create({ task: newTask(id), actor: AGENT });
      const r = await store.update({
        taskId: id,
        expectedVersion: 1,
        patch: planApproved('s3://p/1'),
        actor: AGENT,
        reason: 'plan approved',
        messages: [
          { topic, payload: { n: 1 } },
          { topic, payload: { n: 2 } },
        ],
      });
      expect(r.ok).toBe(true);
      expect((await store.get(id))?.version).toBe(2);

      const relay = createRelay({
        db: tdb.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        maxIdleMs: 50,
      });
      relayMetrics(relay, tdb.db);
      const groupId = `${topic}.g`;
      let handled = 0;
      const consumer = createInboxConsumer({
        db: tdb.db,
        groupId,
        subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId, topics: [topic] }),
        dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        handler: async () => {
          handled++;
        },
      });
      inboxMetrics(consumer, { db: tdb.db, groupId, topics: [topic] });
      const running = relay.run();
      void consumer.run();
      try {
        await waitFor('both messages applied', () => consumer.stats().applied === 2, 60_000);
        await waitFor(
          'the outbox to empty',
          async () => (await tdb.db.selectFrom('outbox').select('id').execute()).length === 0,
        );
      } finally {
        await consumer.stop();
        await relay.stop();
        await running;
      }
      expect(handled).toBe(2);
      expect(relay.stats()).toMatchObject({ published: 2, lostLaneDeletes: 0, waitingFor: null });
      expect(await tdb.db.selectFrom('inbox_dlq').select('message_id').execute()).toEqual([]);
    });
  }
});

describe('an outbox row whose created_at no Date can hold', () => {
  it("is published once like any other, and another tenant's rows in the batch too: nothing is sent again, the outbox empties", async () => {
    const { asA, app } = await twoTenants(tdb);
    const topic = await createTestTopic('bad-created-at', 1);
    try {
      // A tenant's own SQL may no longer set created_at (migration 0012: tenants insert the
      // library's columns only); rows from before, or the owner's, may hold +/-infinity, or a
      // year past what a JS Date holds.
      const refused =
        await sql`INSERT INTO outbox (lane, message_id, topic, key, headers, payload, created_at)
                  VALUES (0, gen_random_uuid(), ${topic}, 'a', '{}', '\\x7b7d', 'infinity')`
          .execute(asA)
          .then(
            () => undefined,
            (e: { code?: string }) => e.code,
          );
      expect(refused).toBe('42501');
      for (const [i, at] of ['infinity', '-infinity', '275761-01-01'].entries()) {
        await sql`INSERT INTO outbox (lane, message_id, tenant_id, topic, key, headers, payload, created_at)
                  VALUES (${laneOf(`a${i}`)}, gen_random_uuid(), 'tenant-a', ${topic}, ${`a${i}`}, '{}', '\\x7b7d', ${at}::timestamptz)`.execute(
          tdb.db,
        );
      }
      await tdb.db.transaction().execute((t) =>
        createOutbox().enqueue(
          t,
          [1, 2, 3].map((n) => ({ topic, key: `b${n}`, payload: { n } })),
          { tenantId: 'tenant-b' },
        ),
      );
      const relay = createRelay({
        db: tdb.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        maxIdleMs: 50,
      });
      relayMetrics(relay, tdb.db); // the histogram that threw on such a row after the broker's ack
      const running = relay.run();
      try {
        await waitFor(
          'the outbox to empty',
          async () => (await tdb.db.selectFrom('outbox').select('id').execute()).length === 0,
          60_000,
        );
      } finally {
        await relay.stop();
        await running;
      }
      expect(relay.stats()).toMatchObject({ published: 6, lostLaneDeletes: 0, waitingFor: null });
      const seen = await readTopic(
        kafkaClient(kafkaBrokers(), 'tracer-faults'),
        topic,
        (ms) => ms.length >= 6,
        20_000,
      );
      expect(seen).toHaveLength(6);
    } finally {
      await app.destroy();
    }
  });
});

describe('the publish-to-apply histogram', () => {
  it('counts each message once when a chunk rolls back and is applied again one by one', async () => {
    const topic = await createTestTopic('apply-once', 1);
    await tdb.db.transaction().execute((t) =>
      createOutbox().enqueue(
        t,
        [1, 2, 3].map((n) => ({ topic, key: 'k', payload: { n } })),
      ),
    );
    const relay = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      maxIdleMs: 50,
    });
    const groupId = `${topic}.g`;
    let failed = false;
    const consumer = createInboxConsumer({
      db: tdb.db,
      groupId,
      subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId, topics: [topic] }),
      dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      retryBaseMs: 10,
      handler: async (_trx, m) => {
        // The second message fails once: its chunk rolls back, and is applied again message by message.
        if (m.json<{ n: number }>().n === 2 && !failed) {
          failed = true;
          throw new Error('once');
        }
      },
    });
    const registry = inboxMetrics(consumer, { db: tdb.db, groupId, topics: [topic] });
    // Published only once the consumer runs, so the three arrive in one batch.
    void consumer.run();
    const running = relay.run();
    try {
      await waitFor('three messages applied', () => consumer.stats().applied === 3, 60_000);
    } finally {
      await consumer.stop();
      await relay.stop();
      await running;
    }
    expect(failed).toBe(true);
    expect(await registry.metrics()).toContain(
      `cairn_inbox_publish_to_apply_seconds_count{group="${groupId}"} 3`,
    );
  });
});
