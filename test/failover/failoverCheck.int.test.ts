import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRelay } from '../../relay/relay.js';
import { createKafkaAdmin } from '../../src/kafka/admin.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { checkAfterFailover } from '../../src/recovery/failover.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

/**
 * Region A published transitions; region B (another database here, as a promoted standby
 * that missed A's last commits) must be told exactly which of its tasks lost work: by the
 * message's cairn-task-id and tenant, which the relay sets from the outbox row, never by the
 * message's key, which a caller chooses.
 */
let a: TestDatabase;
let b: TestDatabase;
let topic: string;

beforeAll(async () => {
  [a, b] = await Promise.all([createTestDatabase('failover_a'), createTestDatabase('failover_b')]);
  topic = await createTestTopic('failover-check', 2);
});
afterAll(async () => {
  await a?.drop();
  await b?.drop();
});

describe('failover check', () => {
  it('flags exactly the tasks that lost a transition, whatever keys their messages had', async () => {
    for (const [db, versionOfOther] of [
      [a, 1],
      [b, 2],
    ] as const) {
      const store = createTaskStore({ db: db.db, cacheSize: 0 });
      await store.create({ task: newTask('T1'), actor: AGENT });
      await store.create({ task: newTask('T2'), actor: AGENT });
      await store.create({ task: newTask('O-1', { tenant_id: 'other' }), actor: AGENT });
      if (versionOfOther === 2) {
        // Region B has the other tenant's transition (it replicated in time).
        const r = await store.update({
          taskId: 'O-1',
          expectedVersion: 1,
          patch: { status: 'implementing' },
          actor: AGENT,
        });
        expect(r.ok).toBe(true);
      }
    }
    // Region A commits two transitions and publishes their messages.
    const storeA = createTaskStore({ db: a.db, cacheSize: 0 });
    const t1 = await storeA.update({
      taskId: 'T1',
      expectedVersion: 1,
      patch: { status: 'implementing' },
      actor: AGENT,
      messages: [{ topic, key: 'order-77', payload: { order: 77 } }], // keyed by an order, not the task
    });
    const o1 = await storeA.update({
      taskId: 'O-1',
      expectedVersion: 1,
      patch: { status: 'implementing' },
      actor: AGENT,
      messages: [{ topic, key: 'T2', payload: {} }], // another tenant's key that names a task of acme
    });
    expect(t1.ok && o1.ok).toBe(true);
    const relay = createRelay({ db: a.db, publisher: createKafkaPublisher({ brokers: kafkaBrokers() }) });
    const running = relay.run();
    try {
      await waitFor('region A to publish both messages', async () => relay.stats().published >= 2);
    } finally {
      await relay.stop();
      await running;
    }

    const kafka = createKafkaAdmin({ brokers: kafkaBrokers(), clientId: 'failover-check-test' });
    const report = await checkAfterFailover(b.db, kafka, { topics: [topic] }).finally(() => kafka.close());
    expect(report.divergedTasks).toEqual(['T1']);
    expect(report.lostTransitions).toMatchObject([{ taskId: 'T1', storedVersion: 1, seenVersion: 2 }]);
  });
});
