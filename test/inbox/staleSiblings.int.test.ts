import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createInboxConsumer, type InboxConsumer, type InboxHandler } from '../../consumers/inboxConsumer.js';
import { createRelay, type Relay } from '../../relay/relay.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';
import { createEffectsTable, produceTo, uuid } from './fixtures.js';

// Issue 14.2: the messages one task change causes share its version; refusing stale versions
// must not drop the second of them as "not newer" than the first.

const kafka = kafkaClient(kafkaBrokers(), 'stale-siblings-test');
let tdb: TestDatabase;
let relay: Relay | undefined;
let relayDone: Promise<void> | undefined;
let consumer: InboxConsumer | undefined;

beforeAll(async () => {
  tdb = await createTestDatabase('stale_siblings');
  await createEffectsTable(tdb.db);
});
afterAll(async () => {
  await consumer?.stop();
  await relay?.stop();
  await relayDone;
  await tdb.drop();
});

const recordEffect: InboxHandler = async (trx, m) => {
  const { seq } = m.json<{ seq: number }>();
  await sql`INSERT INTO effects (message_id, key, seq, consumer) VALUES (${m.messageId}, ${m.key ?? ''}, ${seq}, 'siblings')`.execute(
    trx,
  );
};

async function appliedSeqs(): Promise<number[]> {
  const { rows } = await sql<{ seq: number }>`SELECT seq FROM effects ORDER BY id`.execute(tdb.db);
  return rows.map((r) => r.seq);
}

describe('issue 14.2: refuseStaleVersions and the messages of one change', () => {
  it('every message of one task change is applied once, in order, and an older message redelivered later is still refused as stale', async () => {
    const topic = await createTestTopic('stale-siblings', 1);
    const groupId = `${topic}.g`;
    const taskId = `task-${uuid()}`;
    const store = createTaskStore({ db: tdb.db });
    await store.create({ task: newTask(taskId), actor: AGENT });
    const updated = await store.update({
      taskId,
      expectedVersion: 1,
      patch: {
        budget: { currency_committed_usd: 100, currency_spent_usd: 1, tokens_spent: 10, hops_used: 1 },
      },
      actor: AGENT,
      messages: [
        { topic, payload: { seq: 1 } },
        { topic, payload: { seq: 2 } },
      ],
    });
    expect(updated.ok).toBe(true);

    relay = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      maxIdleMs: 50,
    });
    relayDone = relay.run();
    const c = createInboxConsumer({
      db: tdb.db,
      groupId,
      subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId, topics: [topic] }),
      dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      handler: recordEffect,
      refuseStaleVersions: true,
      maxAttempts: 2,
      retryBaseMs: 10,
    });
    consumer = c;
    void c.run();

    const handled = () => c.stats().applied + c.stats().stale + c.stats().duplicates + c.stats().deadLettered;
    await waitFor('both messages of the change to be handled', () => handled() >= 2, 30_000);
    expect(await appliedSeqs()).toEqual([1, 2]);
    expect(c.stats()).toMatchObject({ applied: 2, stale: 0 });

    // The change's first message comes again as a new message (a producer replaying it):
    // it is older than what the key has applied, so it is refused.
    const [first] = await readTopic(kafka, topic, (ms) => ms.length >= 2, 30_000);
    expect(first!.value).toBe(JSON.stringify({ seq: 1 }));
    await produceTo(topic, [
      { key: first!.key, value: first!.value, headers: { ...first!.headers, 'cairn-message-id': uuid() } },
    ]);
    await waitFor('the redelivered message to be handled', () => handled() >= 3, 30_000);
    expect(c.stats()).toMatchObject({ applied: 2, stale: 1 });
    expect(await appliedSeqs()).toEqual([1, 2]);
  });
});
