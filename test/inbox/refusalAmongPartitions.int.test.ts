import { setTimeout as sleep } from 'node:timers/promises';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { localKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys } from '../../src/crypto/tenantKeys.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { refusingTenant } from '../support/keyProviders.js';
import type { TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { keyedTenants, onTestBroker, topicOfPartitions } from './fixtures.js';

let t: TestDatabase;
let keyringPath: string;

beforeAll(async () => {
  ({ t, keyringPath } = await keyedTenants('refusal_partitions'));
});
afterAll(async () => {
  await t?.drop();
});

it("one tenant's refused key is dead-lettered past the bound while other partitions keep committing", async () => {
  const provider = refusingTenant(localKeyring(keyringPath), 'acme');
  const store = createTaskStore({ db: t.db, keys: createTenantKeys({ db: t.db, provider }), cacheSize: 0 });
  // Partition 0: acme's message, then globex's behind it. Partitions 1 and 2: globex's, 400
  // each, applied one per transaction at a steady pace until acme's message is dead-lettered
  // (16 s at least: longer than the deadline below), at full speed after.
  const others = (p: number) => Array.from({ length: 400 }, (_, i) => `globex:${p}:${i}`);
  const topic = await topicOfPartitions('refusal-partitions', [
    ['acme:0:0', 'globex:0:after'],
    others(1),
    others(2),
  ]);
  const group = `${topic}.g`;
  const consumer = createInboxConsumer({
    db: t.db,
    groupId: group,
    ...onTestBroker(group, topic),
    chunkSize: 1,
    maxAttempts: 3,
    retryBaseMs: 50,
    retryMaxMs: 200,
    handler: async (trx, m) => {
      const value = m.value?.toString() ?? '';
      const task = await store.get(`T-${value.split(':')[0]}`);
      await sql`INSERT INTO effects VALUES (${value}, ${task!.artifacts.implementation_plan})`.execute(trx);
      if (m.partition !== 0 && consumer.stats().deadLettered === 0) await sleep(40);
    },
  });
  void consumer.run();
  try {
    // Bound: 4 x 3 x 200 ms = 2.4 s, then three attempts. Before, never while the others committed.
    await waitFor(
      "acme's message dead-lettered",
      async () => {
        const r = await sql<{ n: number }>`SELECT count(*)::int AS n FROM inbox_dlq`.execute(t.db);
        return r.rows[0]!.n > 0;
      },
      12_000,
    );
    await waitFor(
      'every other message applied',
      async () => {
        const r = await sql<{ n: number }>`SELECT count(*)::int AS n FROM effects`.execute(t.db);
        return r.rows[0]!.n >= 801;
      },
      60_000,
    );
    const effects = await sql<{ total: number; distinct_ids: number; after: number; acme: number }>`
      SELECT count(*)::int AS total, count(DISTINCT message_id)::int AS distinct_ids,
             count(*) FILTER (WHERE message_id = 'globex:0:after')::int AS after,
             count(*) FILTER (WHERE plan = 's3://acme')::int AS acme
        FROM effects`.execute(t.db);
    const dlq = await sql<{ partition: number; offset: string }>`
      SELECT partition, "offset"::text FROM inbox_dlq`.execute(t.db);
    expect({ effects: effects.rows[0], dlq: dlq.rows, deadLettered: consumer.stats().deadLettered }).toEqual({
      effects: { total: 801, distinct_ids: 801, after: 1, acme: 0 },
      dlq: [{ partition: 0, offset: '0' }],
      deadLettered: 1,
    });
  } finally {
    await consumer.stop();
  }
});
