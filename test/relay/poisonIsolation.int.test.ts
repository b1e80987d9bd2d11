import { Migrator, sql } from 'kysely';
import { v7 as uuidv7 } from 'uuid';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { migrationProvider } from '../../migrations/index.js';
import { createRelay, createRelayWithTestHooks, type Relay } from '../../relay/relay.js';
import { migrateToLatest } from '../../src/db/migrate.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { laneOf } from '../../src/outbox/lanes.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase, uniqueTopic } from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';

// Issues 14.8 and 22.2: a message that can never be published parks its own key, and only
// its own: not a healthy key caught by a passing broker error, not every other tenant's.

const kafka = kafkaClient(kafkaBrokers(), 'poison-isolation-test');
const outbox = createOutbox();
const dbs: TestDatabase[] = [];
let relay: Relay | undefined;
let relayDone: Promise<void> | undefined;

afterEach(async () => {
  await relay?.stop();
  await relayDone;
  relay = undefined;
});
afterAll(async () => {
  for (const d of dbs) await d.drop();
});

/** A topic of its own that refuses messages over 1 KB. */
async function createSmallTopic(label: string): Promise<string> {
  const topic = uniqueTopic(label);
  const admin = kafka.admin();
  await admin.connect();
  try {
    await admin.createTopics({
      topics: [{ topic, numPartitions: 1, configEntries: [{ name: 'max.message.bytes', value: '1024' }] }],
      waitForLeaders: true,
    });
  } finally {
    await admin.disconnect();
  }
  return topic;
}

async function parkedKeys(tdb: TestDatabase) {
  return tdb.db.selectFrom('outbox_parked_key').select(['topic', 'key', 'message_id', 'error']).execute();
}

async function outboxIds(tdb: TestDatabase): Promise<string[]> {
  const rows = await tdb.db.selectFrom('outbox').select('message_id').orderBy('id').execute();
  return rows.map((r) => r.message_id);
}

/** True once every row left in the outbox waits behind a parked key (nothing more will move). */
async function onlyParkedKeysLeft(tdb: TestDatabase): Promise<boolean> {
  const { rows } = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM outbox o
     WHERE NOT EXISTS (SELECT 1 FROM outbox_parked_key p WHERE p.topic = o.topic AND p.key = o.key)`.execute(
    tdb.db,
  );
  return rows[0]!.n === 0;
}

describe('issue 14.8: poison isolation', () => {
  it('a transient broker error during poison isolation parks no healthy key: every healthy message is delivered and only the poison key is parked', async () => {
    const tdb = await createTestDatabase('poison_isolation');
    dbs.push(tdb);
    const topic = await createSmallTopic('poison-isolation');
    const message = (key: string, n: number, bytes = 10) => ({
      topic,
      key,
      payload: Buffer.from(`${n}:`.padEnd(bytes, 'x')),
    });
    // One transaction: the relay claims them as one batch, which the broker refuses whole.
    const ids = await tdb.db
      .transaction()
      .execute((t) =>
        outbox.enqueue(t, [
          message('healthy-a', 1),
          message('poisoned', 2, 4000),
          message('healthy-b', 3),
          message('healthy-a', 4),
          message('healthy-c', 5),
        ]),
      );
    const poison = ids[1]!;
    const healthy = ids.filter((id) => id !== poison);

    let injectedAt: string | undefined;
    relay = createRelayWithTestHooks(
      {
        db: tdb.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        maxIdleMs: 50,
      },
      {
        beforeIsolatedPublish(messageId) {
          if (injectedAt !== undefined || messageId === poison) return;
          injectedAt = messageId;
          throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:19092'), { code: 'ECONNREFUSED' });
        },
      },
    );
    relayDone = relay.run();

    await waitFor(
      'the poison key to be parked and every other row to be gone',
      async () =>
        (await parkedKeys(tdb)).some((p) => p.key === 'poisoned') && (await onlyParkedKeysLeft(tdb)),
      45_000,
    );
    const delivered = await readTopic(kafka, topic, (ms) => ms.length >= healthy.length, 30_000);

    expect(injectedAt).toBeDefined();
    expect((await parkedKeys(tdb)).map((p) => ({ key: p.key, message_id: p.message_id }))).toEqual([
      { key: 'poisoned', message_id: poison },
    ]);
    expect(delivered.map((m) => m.headers['cairn-message-id']).sort()).toEqual([...healthy].sort());
    expect(await outboxIds(tdb)).toEqual([poison]);
  });
});

describe('issue 22.2: a row the relay can never publish', () => {
  it('one bad row (written before migration 0008) parks its own key only: 1,000 messages of other keys and tenants are all delivered', async () => {
    const tdb = await createTestDatabase('bad_row', { migrate: false });
    dbs.push(tdb);
    const topic = uniqueTopic('bad-row');
    // Cairn's own migrator, stopped after 0007: its schema and its migration tables.
    await sql`CREATE SCHEMA cairn`.execute(tdb.db);
    const { error } = await new Migrator({
      db: tdb.db,
      provider: migrationProvider,
      migrationTableSchema: 'cairn',
      migrationTableName: 'cairn_migration',
      migrationLockTableName: 'cairn_migration_lock',
    }).migrateTo('0007_quarantine');
    expect(error).toBeUndefined();
    // Before 0008 nothing checked the stored headers: a header whose value is a JSON number.
    const bad = uuidv7();
    await sql`INSERT INTO outbox (lane, message_id, tenant_id, topic, key, headers, payload)
              VALUES (${laneOf('bad-key')}, ${bad}::uuid, 'acme', ${topic}, 'bad-key', '{"x": 5}'::jsonb,
                      ${Buffer.from('{}')})`.execute(tdb.db);
    await migrateToLatest(tdb.db);

    const sent: string[] = [];
    for (const tenantId of ['acme', 'globex']) {
      for (let chunk = 0; chunk < 5; chunk++) {
        const messages = Array.from({ length: 100 }, (_, i) => ({
          topic,
          key: `k${i % 50}`,
          payload: { tenant: tenantId, n: chunk * 100 + i },
        }));
        sent.push(...(await tdb.db.transaction().execute((t) => outbox.enqueue(t, messages, { tenantId }))));
      }
    }
    expect(sent).toHaveLength(1000);

    relay = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      maxIdleMs: 50,
      batchSize: 200,
    });
    relayDone = relay.run();
    // Bounded: on failure the assertions below say what was not delivered.
    await waitFor(
      'every row but the bad one to be published',
      async () => (await outboxIds(tdb)).length === 1 && (await parkedKeys(tdb)).length > 0,
      40_000,
    ).catch(() => {});

    const left = await outboxIds(tdb);
    expect(left.length, 'rows left in the outbox').toBe(1);
    expect(left).toEqual([bad]);
    const parked = await parkedKeys(tdb);
    expect(parked).toEqual([
      {
        topic,
        key: 'bad-key',
        message_id: bad,
        error: expect.stringContaining('header "x" is number, not a string'),
      },
    ]);
    const delivered = await readTopic(kafka, topic, (ms) => ms.length >= 1000, 15_000);
    expect(new Set(delivered.map((m) => m.headers['cairn-message-id']))).toEqual(new Set(sent));
    expect(delivered).toHaveLength(1000);
  });
});
