import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRelay } from '../../relay/relay.js';
import { createKafkaAdmin } from '../../src/kafka/admin.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
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
  // Review: an applied effect was counted as known when any receipt had its key, of any task
  // or tenant: another tenant's row under the same key (written with its own SQL, for a task of
  // its own) hid this task's lost receipt, and its worker would run the effect again.
  it("an applied effect whose key only another task's receipt has is reported missing for its own task", async () => {
    const forged = 'sha256:effect-of-T2';
    await b.db
      .insertInto('tool_receipt')
      .values({
        receipt_id: '00000000-0000-4000-8000-0000000000b2',
        idempotency_key: forged,
        task_id: 'O-1', // the other tenant's task
        step: 'charge',
        tool: 'payments.charge',
        args_digest: forged,
        status: 'started', // a receipt in any state says the effect is known
        irreversible: false,
        worker: 'other-tenant',
      })
      .execute();
    const kafka = createKafkaAdmin({ brokers: kafkaBrokers(), clientId: 'failover-check-receipts' });
    const report = await checkAfterFailover(b.db, kafka, {
      topics: [topic],
      appliedEffects: [
        { idempotencyKey: forged, taskId: 'T2' },
        { idempotencyKey: forged, taskId: 'O-1' }, // its own: known
      ],
    }).finally(() => kafka.close());
    expect(report.missingReceipts).toEqual([{ idempotencyKey: forged, taskId: 'T2' }]);
    expect(report.divergedTasks).toContain('T2');
    const receipts = createReceiptStore({ db: b.db });
    expect(await receipts.byKey(forged, 'T2')).toBeUndefined();
    expect((await receipts.byKey(forged, 'O-1'))?.task_id).toBe('O-1');
  });
});
