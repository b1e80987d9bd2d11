import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { type KeyProvider, localKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys } from '../../src/crypto/tenantKeys.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import type { TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { keyedTenants, oneTopicOf, onTestBroker } from './fixtures.js';

let t: TestDatabase;
let keyringPath: string;

beforeAll(async () => {
  ({ t, keyringPath } = await keyedTenants('adv5_kms_refusal'));
});
afterAll(async () => {
  await t?.drop();
});

it("a KMS that refuses one tenant's key does not hold another tenant's message forever", async () => {
  const inner = localKeyring(keyringPath);
  // acme's KMS key was disabled by acme's admin: the KMS answers, and answers no.
  const provider: KeyProvider = {
    currentKekId: () => inner.currentKekId(),
    wrap: (id, key, context) => inner.wrap(id, key, context),
    unwrap: async (id, wrapped, context) => {
      if (context.startsWith('acme/'))
        throw Object.assign(new Error('AccessDeniedException: the key is disabled'), {
          name: 'AccessDeniedException',
        });
      return inner.unwrap(id, wrapped, context);
    },
  };
  const store = createTaskStore({ db: t.db, keys: createTenantKeys({ db: t.db, provider }), cacheSize: 0 });
  // m0 is acme's, m1 globex's: one partition.
  const topic = await oneTopicOf('kms-refusal', 2);
  const group = `${topic}.g`;
  const consumer = createInboxConsumer({
    db: t.db,
    groupId: group,
    ...onTestBroker(group, topic),
    maxAttempts: 3,
    retryBaseMs: 50,
    retryMaxMs: 200,
    handler: async (trx, m) => {
      const id = m.value?.toString() === 'm0' ? 'T-acme' : 'T-globex';
      const task = await store.get(id);
      await sql`INSERT INTO effects VALUES (${m.value?.toString() ?? ''}, ${task!.artifacts.implementation_plan})`.execute(
        trx,
      );
    },
  });
  void consumer.run();
  try {
    // The refusal is waited for 4 x 3 x 200 ms = 2.4 s (it could be an outage), then m0's three
    // attempts count: dead-lettered, and m1 applied. Before, neither happened, ever.
    await waitFor(
      "globex's message applied and acme's dead-lettered",
      async () => {
        const r = await sql<{ n: number }>`
          SELECT (SELECT count(*) FROM effects) + (SELECT count(*) FROM inbox_dlq) AS n`.execute(t.db);
        return Number(r.rows[0]!.n) >= 2;
      },
      30_000,
    );
    const effects = await sql<{ message_id: string }>`SELECT message_id FROM effects`.execute(t.db);
    const dlq = await sql<{ n: number }>`SELECT count(*)::int AS n FROM inbox_dlq`.execute(t.db);
    expect({
      globexApplied: effects.rows.map((r) => r.message_id),
      acmeDeadLettered: dlq.rows[0]!.n,
      waitingFor: consumer.waitingFor(),
    }).toEqual({ globexApplied: ['m1'], acmeDeadLettered: 1, waitingFor: null });
  } finally {
    await consumer.stop();
  }
});
