/**
 * adversary5: c42234d made TenantKeys name EVERY failure from outside Cairn an outage
 * (outagesNamed -> UnavailableError), and the inbox consumer waits for an UnavailableError
 * without end, counting no attempt. A KMS that answers "no" (AccessDeniedException: the key is
 * disabled, InvalidCiphertextException, a provider's own bug) is not down: it is a real
 * failure that no wait fixes. One tenant's disabled key then holds its partition for good:
 * its message is never dead-lettered, and another tenant's message behind it on the same
 * partition is never applied (nor does the consumer ever say what it waits for).
 * Expected: a refusal spends the message's attempts (dead-lettered after maxAttempts, or at
 * least after a bounded wait) and the next tenant's message is applied.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { type KeyProvider, localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys } from '../../src/crypto/tenantKeys.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { oneTopicOf, onTestBroker } from './fixtures.js';

let t: TestDatabase;
let keyringPath: string;

beforeAll(async () => {
  t = await createTestDatabase('adv5_kms_refusal');
  await sql`CREATE TABLE effects (message_id text PRIMARY KEY, plan text)`.execute(t.db);
  keyringPath = join(mkdtempSync(join(tmpdir(), 'cairn-adv5-kms-')), 'keyring.json');
  writeKeyring(keyringPath);
  const keys = createTenantKeys({ db: t.db, provider: localKeyring(keyringPath) });
  const store = createTaskStore({ db: t.db, keys });
  for (const tenant of ['acme', 'globex']) {
    await keys.addTenant(tenant);
    await store.create({
      task: {
        ...newTask(`T-${tenant}`, { tenant_id: tenant }),
        artifacts: { implementation_plan: `s3://${tenant}` },
      },
      actor: AGENT,
    });
  }
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
