/**
 * One convention for every public factory: one options object, validated with zod, a bad
 * field named with its value, an unknown key refused, and no test hooks in the documented
 * option types. Nothing here connects: the database is a stand-in with a Db's methods (a
 * factory only keeps it), and the Kafka clients are only made.
 */
import { describe, expect, expectTypeOf, it } from 'vitest';
import {
  createInboxConsumer,
  createKafkaSubscriber,
  type InboxConsumerOptions,
  type KafkaSubscriberOptions,
} from '../../consumers/index.js';
import { createKafkaPublisher, createRelay, type RelayOptions } from '../../relay/index.js';
import {
  type CheckpointerOptions,
  checkAfterFailover,
  createCheckpointer,
  createDb,
  createLeaseManager,
  createLogger,
  createOutbox,
  createReceiptStore,
  createTaskStore,
  createTenantKeys,
  type Db,
  type ReceiptStoreOptions,
  type RetentionOptions,
  resume,
  runRetention,
  ValidationError,
} from '../../src/index.js';
import { kafkaClient } from '../../src/kafka/publisher.js';

const db = { selectFrom() {}, transaction() {} } as unknown as Db;
const brokers = ['127.0.0.1:1'];
const publisher = createKafkaPublisher({ brokers });
const subscriber = createKafkaSubscriber({ brokers, groupId: 'g', topics: ['t'] });
const store = createTaskStore({ db });
const checkpoints = createCheckpointer({ db });
const receipts = createReceiptStore({ db });
const leases = createLeaseManager({ db });
const provider = {
  currentKekId: async () => 'k',
  wrap: async () => Buffer.alloc(0),
  unwrap: async () => Buffer.alloc(0),
};
const resumeOptions = {
  db,
  store,
  checkpoints,
  receipts,
  leases,
  workflowDefinition: {},
  policy: async () => ({ version: '1', allowed: true, budgetLimitUsd: 1 }),
  actor: 'spiffe://acme.example/agents/a',
  agentId: 'a',
};

/** The ValidationError `call` throws (or rejects with). */
async function refusal(call: () => unknown): Promise<ValidationError> {
  try {
    await call();
  } catch (err) {
    expect(err).toBeInstanceOf(ValidationError);
    return err as ValidationError;
  }
  throw new Error('expected a ValidationError, nothing was thrown');
}

/** Each public factory with a valid options object made bad in one field. */
const factories: Array<{ name: string; field: string; value: unknown; call: (bad: object) => unknown }> = [
  {
    name: 'createDb',
    field: 'max',
    value: -3,
    call: (b) => createDb({ connectionString: 'postgres://x@h/d', ...b }),
  },
  { name: 'createTaskStore', field: 'cacheSize', value: -1, call: (b) => createTaskStore({ db, ...b }) },
  { name: 'createOutbox', field: 'maxPayloadBytes', value: 0, call: (b) => createOutbox(b) },
  {
    name: 'createLeaseManager',
    field: 'db',
    value: 'postgres://x',
    call: (b) => createLeaseManager({ db, ...b }),
  },
  {
    name: 'LeaseManager.acquire',
    field: 'ttlMs',
    value: 86_400_001,
    call: (b) => leases.acquire({ taskId: 't', branch: 'main', agentId: 'a', ttlMs: 1000, ...b }),
  },
  {
    name: 'createReceiptStore',
    field: 'abandonAfterMs',
    value: -5,
    call: (b) => createReceiptStore({ db, ...b }),
  },
  {
    name: 'createCheckpointer',
    field: 'allowLegacyCheckpoints',
    value: 'yes',
    call: (b) => createCheckpointer({ db, ...b }),
  },
  {
    name: 'createTenantKeys',
    field: 'provider',
    value: 'kms',
    call: (b) => createTenantKeys({ db, provider, ...b }),
  },
  { name: 'resume', field: 'leaseTtlMs', value: 1.5, call: (b) => resume('T-1', { ...resumeOptions, ...b }) },
  {
    name: 'checkAfterFailover',
    field: 'topics',
    value: 'orders',
    call: (b) => checkAfterFailover(db, kafkaClient(brokers, 'c'), { topics: ['orders'], ...b }),
  },
  {
    name: 'runRetention',
    field: 'batchSize',
    value: 0,
    call: (b) => runRetention({ db, actor: 'op', ...b }),
  },
  { name: 'createLogger', field: 'level', value: 'loud', call: (b) => createLogger(b) },
  { name: 'createRelay', field: 'batchSize', value: 2.5, call: (b) => createRelay({ db, publisher, ...b }) },
  {
    name: 'createKafkaPublisher',
    field: 'brokers',
    value: 'h:9092',
    call: (b) => createKafkaPublisher({ brokers, ...b }),
  },
  {
    name: 'createInboxConsumer',
    field: 'maxAttempts',
    value: 0,
    call: (b) =>
      createInboxConsumer({
        db,
        subscriber,
        dlqPublisher: publisher,
        groupId: 'g',
        handler: async () => {},
        ...b,
      }),
  },
  {
    name: 'createKafkaSubscriber',
    field: 'sessionTimeoutMs',
    value: -1,
    call: (b) => createKafkaSubscriber({ brokers, groupId: 'g', topics: ['t'], ...b }),
  },
];

describe('every public factory validates its options with zod', () => {
  it.each(factories)('$name: a bad $field is a ValidationError naming the field and the value', async (f) => {
    const err = await refusal(() => f.call({ [f.field]: f.value }));
    expect(err.code).toBe('validation_failed');
    expect(err.issues.map((i) => i.path)).toContain(f.field);
    expect(err.message).toContain(f.field);
    expect(err.message).toContain(JSON.stringify(f.value));
  });

  it.each(factories)('$name: an unknown key is refused by name (a typo is not ignored)', async (f) => {
    const err = await refusal(() => f.call({ ttlSecondz: 30 }));
    expect(err.message).toContain('"ttlSecondz"');
  });

  it('the documented option types hold no test hooks', () => {
    expectTypeOf<RelayOptions>().not.toHaveProperty('hooks');
    expectTypeOf<InboxConsumerOptions>().not.toHaveProperty('hooks');
    expectTypeOf<ReceiptStoreOptions>().not.toHaveProperty('hooks');
    expectTypeOf<CheckpointerOptions>().not.toHaveProperty('hooks');
    expectTypeOf<RetentionOptions>().not.toHaveProperty('hooks');
    expectTypeOf<KafkaSubscriberOptions>().not.toHaveProperty('hooks');
    // The inbox consumer's per-commit counts are a documented callback, not a hook.
    expectTypeOf<InboxConsumerOptions>().toHaveProperty('onCommitted');
  });
});
