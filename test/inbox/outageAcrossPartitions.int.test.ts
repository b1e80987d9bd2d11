import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { localKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys } from '../../src/crypto/tenantKeys.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { switchableProvider } from '../support/keyProviders.js';
import type { TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { keyedTenants, onTestBroker, topicOfPartitions } from './fixtures.js';

let t: TestDatabase;
let keyringPath: string;

beforeAll(async () => {
  ({ t, keyringPath } = await keyedTenants('outage_partitions'));
});
afterAll(async () => {
  await t?.drop();
});

it('a key provider down for everybody past the bound dead-letters nothing: each message applied once after', async () => {
  const { provider, s } = switchableProvider(localKeyring(keyringPath));
  const store = createTaskStore({ db: t.db, keys: createTenantKeys({ db: t.db, provider }), cacheSize: 0 });
  const values = (p: number) => [`acme:${p}:0`, `globex:${p}:1`, `acme:${p}:2`];
  const topic = await topicOfPartitions('outage-partitions', [values(0), values(1), values(2)]);
  const group = `${topic}.g`;
  s.down = true;
  const boundMs = 4 * 2 * 100;
  const consumer = createInboxConsumer({
    db: t.db,
    groupId: group,
    ...onTestBroker(group, topic),
    maxAttempts: 2,
    retryBaseMs: 20,
    retryMaxMs: 100,
    handler: async (trx, m) => {
      const value = m.value?.toString() ?? '';
      const task = await store.get(`T-${value.split(':')[0]}`);
      await sql`INSERT INTO effects VALUES (${value}, ${task!.artifacts.implementation_plan})`.execute(trx);
    },
  });
  void consumer.run();
  try {
    // Down for five times the bound (counted from the provider's first refused connection).
    await waitFor(
      'the provider down for five times the bound',
      () => s.failures > 0 && performance.now() - s.downSince > 5 * boundMs,
      30_000,
    );
    const during = await sql<{ n: number }>`SELECT count(*)::int AS n FROM inbox_dlq`.execute(t.db);
    expect({
      deadLetters: during.rows[0]!.n,
      deadLettered: consumer.stats().deadLettered,
      waitingFor: consumer.waitingFor(),
    }).toEqual({ deadLetters: 0, deadLettered: 0, waitingFor: 'dependency' });

    s.down = false;
    await waitFor(
      'every message applied',
      async () => {
        const r = await sql<{ n: number }>`SELECT count(*)::int AS n FROM effects`.execute(t.db);
        return r.rows[0]!.n >= 9;
      },
      30_000,
    );
    const effects = await sql<{ total: number; distinct_ids: number }>`
      SELECT count(*)::int AS total, count(DISTINCT message_id)::int AS distinct_ids FROM effects`.execute(
      t.db,
    );
    const dlq = await sql<{ n: number }>`SELECT count(*)::int AS n FROM inbox_dlq`.execute(t.db);
    expect({
      effects: effects.rows[0],
      deadLetters: dlq.rows[0]!.n,
      deadLettered: consumer.stats().deadLettered,
      waitingFor: consumer.waitingFor(),
    }).toEqual({ effects: { total: 9, distinct_ids: 9 }, deadLetters: 0, deadLettered: 0, waitingFor: null });
  } finally {
    await consumer.stop();
  }
});
