// Review (a Postgres that cannot take writes now is an outage): in a failover the consumer's
// address may reach a server that is read-only (a standby not promoted yet, or the old primary
// demoted). Every inbox insert then fails with 25006 while a ping answers, so the consumer takes
// it for the message's failure: after its attempts it publishes the message to `<topic>.dlq`
// (then fails to record it, and does it again on every redelivery). Expected: nothing sent to
// the dead-letter topic while Postgres only refuses writes.
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { createDb, type Db } from '../../src/db/database.js';
import type { Publisher } from '../../src/kafka/publisher.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { oneTopicOf, onTestBroker } from './fixtures.js';

let t: TestDatabase;
let readOnly: Db;
beforeAll(async () => {
  t = await createTestDatabase('inbox_read_only');
  await sql`CREATE TABLE effects (message_id text PRIMARY KEY)`.execute(t.db);
  const url = new URL(t.url);
  url.searchParams.set('options', '-c default_transaction_read_only=on');
  readOnly = createDb({ connectionString: url.toString(), max: 4 });
});
afterAll(async () => {
  await readOnly?.destroy();
  await t?.drop();
});

it('a read-only Postgres (failover in progress) sends nothing to the dead-letter topic', async () => {
  const topic = await oneTopicOf('read-only', 1);
  const group = `${topic}.g`;
  const broker = onTestBroker(group, topic);
  const sentToDlq: string[] = [];
  const dlqPublisher: Publisher = Object.assign(Object.create(broker.dlqPublisher) as Publisher, {
    publish: async (ms: Parameters<Publisher['publish']>[0]) => {
      for (const m of ms) sentToDlq.push(m.topic);
      return broker.dlqPublisher.publish(ms);
    },
    connect: () => broker.dlqPublisher.connect(),
    disconnect: () => broker.dlqPublisher.disconnect(),
  });
  const consumer = createInboxConsumer({
    db: readOnly,
    groupId: group,
    subscriber: broker.subscriber,
    dlqPublisher,
    handler: async (trx, m) => {
      await sql`INSERT INTO effects VALUES (${m.value?.toString() ?? ''})`.execute(trx);
    },
  });
  void consumer.run();
  try {
    // It says it waits for Postgres (to take writes), and sends nothing meanwhile.
    const until = Date.now() + 15_000;
    while (Date.now() < until && sentToDlq.length === 0 && consumer.waitingFor() !== 'postgres')
      await new Promise((r) => setTimeout(r, 100));
    expect(consumer.waitingFor()).toBe('postgres');
    await new Promise((r) => setTimeout(r, 2000));
    expect(sentToDlq).toEqual([]);
    expect(consumer.waitingFor()).toBe('postgres');
  } finally {
    await consumer.stop();
  }
});

it("a handler's own read-only write on a writable server neither spins nor holds the partition: dead-lettered after its attempts", async () => {
  const topic = await oneTopicOf('read-only-own', 1);
  const group = `${topic}.g`;
  let calls = 0;
  const consumer = createInboxConsumer({
    db: t.db,
    groupId: group,
    ...onTestBroker(group, topic),
    maxAttempts: 2,
    retryBaseMs: 20,
    retryMaxMs: 100,
    handler: async (trx) => {
      calls++;
      // 25006 although the server takes writes: the handler made its own transaction read-only.
      await sql`SET LOCAL transaction_read_only = on`.execute(trx);
      await sql`INSERT INTO effects VALUES ('never')`.execute(trx);
    },
  });
  void consumer.run();
  try {
    // Waited for 4 x 2 x 100 ms at most (it could be a promotion finishing), then its attempts count.
    await waitFor('the message dead-lettered', () => consumer.stats().deadLettered === 1, 30_000);
    // With backoff: a few dozen tries at most, not thousands.
    expect(calls).toBeLessThan(40);
  } finally {
    await consumer.stop();
  }
});
