/**
 * One convention for every public factory: one options object, validated with zod, a bad
 * field named with its value, an unknown key refused, and no test hooks in the documented
 * option types. Nothing here connects: the database is made by createDb but never queried
 * (a factory only keeps it), and the Kafka clients are only made.
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
  createKafkaAdmin,
  createLeaseManager,
  createLogger,
  createOutbox,
  createReceiptStore,
  createTaskStore,
  createTenantKeys,
  type Db,
  forTenant,
  type ReceiptStoreOptions,
  type RetentionOptions,
  resume,
  runRetention,
  ValidationError,
} from '../../src/index.js';

const db = createDb({ connectionString: 'postgres://127.0.0.1:1/never-queried', max: 1 });
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
    call: (b) => checkAfterFailover(db, createKafkaAdmin({ brokers }), { topics: ['orders'], ...b }),
  },
  {
    name: 'createKafkaAdmin',
    field: 'client',
    value: 'librdkafka',
    call: (b) => createKafkaAdmin({ brokers, ...b }),
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

  it("a db not made by createDb (a transaction, the application's own Kysely) is refused by name, its password never shown", async () => {
    const lookalike = { selectFrom() {}, transaction() {}, connectionString: 'postgres://u:hunter2@h/d' };
    for (const bad of [
      lookalike,
      Object.assign(Object.create({ constructor: class Transaction {} }), lookalike),
    ]) {
      const err = await refusal(() => createTaskStore({ db: bad as unknown as Db }));
      expect(err.message).toMatch(/db: must be a database made by createDb\(\) or forTenant\(\)/);
      expect(err.message).not.toContain('hunter2');
    }
    expect(() => createTaskStore({ db: forTenant(db, 'acme') })).not.toThrow();
  });

  it('a duration past what a Node timer can wait is refused, not turned into a 1 ms loop', async () => {
    const err = await refusal(() =>
      createInboxConsumer({
        db,
        subscriber,
        dlqPublisher: publisher,
        groupId: 'g',
        handler: async () => {},
        pruneEveryMs: 2 ** 31,
      }),
    );
    expect(err.message).toContain('pruneEveryMs');
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

describe('inputs renamed in 0.3 are refused by their old name, never silently ignored', () => {
  const actor = 'spiffe://acme.example/agents/a';
  const staleLease = { taskId: 't', branch: 'main', leaseId: 'l', fencingToken: 1 };

  it('update({ fence }): refused before anything is read or written (an ignored fence would leave the write unfenced)', async () => {
    const err = await refusal(() =>
      store.update({
        taskId: 't',
        expectedVersion: 1,
        patch: {},
        actor,
        ...({ fence: staleLease } as object),
      }),
    );
    expect(err.message).toContain('fence: renamed to lease');
  });

  it('enqueue context { fence }: refused before anything is written', async () => {
    const outbox = createOutbox();
    const err = await refusal(() =>
      outbox.enqueue(db as never, [{ topic: 't', payload: {} }], { fence: staleLease } as never),
    );
    expect(err.message).toContain('fence: renamed to lease');
  });

  it('renew(lease, 30) and acquire({ ttlMs: 5 }): seconds passed where milliseconds are taken are refused with the hint', async () => {
    const lease = { ...staleLease, holder: 'a', expiresAt: new Date() } as never;
    for (const call of [
      () => leases.renew(lease, 30),
      () => leases.acquire({ taskId: 't', branch: 'main', agentId: 'a', ttlMs: 5 }),
    ]) {
      expect((await refusal(call)).message).toMatch(
        /ttlMs: must be at least 100 ms: leases take milliseconds/,
      );
    }
  });
});
