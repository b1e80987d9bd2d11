// Review (a dependency that is down is not a bad message): an inbox handler that reads a task
// whose artifacts are encrypted with the tenant's key needs the key provider (a KMS). A KMS
// that is out of reach for a few seconds spends the message's attempts within ~1.5 s (the
// retries are 100 ms-based) and the healthy message is dead-lettered; the consumer only asks
// whether Postgres is down. Expected: like a Postgres outage, no attempt is spent on it.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys } from '../../src/crypto/tenantKeys.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { switchableProvider } from '../support/keyProviders.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { oneTopicOf, onTestBroker } from './fixtures.js';

let t: TestDatabase;
let keyringPath: string;

beforeAll(async () => {
  t = await createTestDatabase('inbox_kms_outage');
  await sql`CREATE TABLE effects (message_id text PRIMARY KEY, plan text)`.execute(t.db);
  keyringPath = join(mkdtempSync(join(tmpdir(), 'cairn-review-kms-')), 'keyring.json');
  writeKeyring(keyringPath);
  const keys = createTenantKeys({ db: t.db, provider: localKeyring(keyringPath) });
  await keys.addTenant('acme');
  await createTaskStore({ db: t.db, keys }).create({
    task: { ...newTask('T-kms'), artifacts: { implementation_plan: 's3://plans/kms' } },
    actor: AGENT,
  });
});
afterAll(async () => {
  await t?.drop();
});

it('a KMS down for 4 s dead-letters nothing: the message is applied once it answers', async () => {
  const { provider, s } = switchableProvider(localKeyring(keyringPath));
  // The consumer's process: its own tenant keys (nothing unwrapped is cached yet).
  const store = createTaskStore({ db: t.db, keys: createTenantKeys({ db: t.db, provider }), cacheSize: 0 });
  const topic = await oneTopicOf('kms-outage', 1);
  const group = `${topic}.g`;
  s.down = true;
  const back = setTimeout(() => {
    s.down = false;
  }, 4000);
  const consumer = createInboxConsumer({
    db: t.db,
    groupId: group,
    ...onTestBroker(group, topic),
    handler: async (trx, m) => {
      const task = await store.get('T-kms');
      await sql`INSERT INTO effects VALUES (${m.value?.toString() ?? ''}, ${task!.artifacts.implementation_plan})`.execute(
        trx,
      );
    },
  });
  void consumer.run();
  try {
    await waitFor(
      'the message applied (or dead-lettered)',
      async () => {
        const r = await sql<{ n: number }>`
          SELECT (SELECT count(*) FROM effects) + (SELECT count(*) FROM inbox_dlq) AS n`.execute(t.db);
        return Number(r.rows[0]!.n) > 0;
      },
      60_000,
    );
    expect(consumer.stats().deadLettered).toBe(0);
    const r = await sql<{ plan: string }>`SELECT plan FROM effects`.execute(t.db);
    expect(r.rows).toEqual([{ plan: 's3://plans/kms' }]);
  } finally {
    clearTimeout(back);
    await consumer.stop();
  }
});
