// A restored inbox row and a message's record timestamp, which its producer chooses (CreateTime:
// a producer's clock, or a value it sets): neither an old nor a future one may make region B
// apply a message twice or hide a lost consumption (review findings: the replay had stamped the
// restored row with it). Same set-up as replayRestoredInbox.int.test.ts, RI-X's time changed.
import { sql } from 'kysely';
import { afterAll, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { pruneInbox } from '../../consumers/sql/pruneInbox.js';
import { createRelay } from '../../relay/relay.js';
import { createKafkaAdmin } from '../../src/kafka/admin.js';
import { createTopicsAndWait } from '../../src/kafka/kafkajsAdmin.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { HEADER } from '../../src/outbox/wire.js';
import { checkAfterFailover } from '../../src/recovery/failover.js';
import { replayChangelog } from '../../src/recovery/replayChangelog.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask, planApproved } from '../state/fixtures.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
  uniqueTopic,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

const PREFIX = 'A.';
const kafka = kafkaClient(kafkaBrokers(), 'restored-time-ts');
const reader = createKafkaAdmin({ brokers: kafkaBrokers(), clientId: 'restored-time-ts-reader' });
const clock = () => new Date('2026-12-01T00:00:00.000Z');
const dbs: TestDatabase[] = [];
afterAll(async () => {
  await reader.close();
  for (const d of dbs) await d.drop();
});

/** Region A applies go-RI-X (record time xAt) and go-RI-Y (5 min ago); only RI-X's changelog record reaches B. */
async function scenario(name: string, xAt: number) {
  const [a, b] = await Promise.all([createTestDatabase(`${name}_a`), createTestDatabase(`${name}_b`)]);
  dbs.push(a, b);
  const changelog = await createTestTopic(`${name}-changelog`, 1);
  const stage = uniqueTopic(`${name}-stage`);
  const mirror = `${PREFIX}${stage}`;
  const admin = kafka.admin();
  await admin.connect();
  await createTopicsAndWait(admin, [
    { topic: stage, numPartitions: 1 },
    { topic: mirror, numPartitions: 1 },
  ]);
  await admin.disconnect();
  const store = (db: TestDatabase['db']) => createTaskStore({ db, clock, changelog: { topic: changelog } });
  const [A, B] = [store(a.db), store(b.db)];
  for (const s of [A, B])
    for (const id of ['RI-X', 'RI-Y']) await s.create({ task: newTask(id), actor: AGENT });
  await sql`DELETE FROM outbox`.execute(a.db);
  const yAt = Date.now() - 5 * 60_000;
  const message = (taskId: string, at: number) => ({
    key: taskId,
    value: '{}',
    timestamp: String(at),
    headers: {
      [HEADER.messageId]: `go-${taskId}`,
      [HEADER.tenant]: 'acme',
      [HEADER.taskId]: taskId,
      [HEADER.taskVersion]: '1',
      [HEADER.taskSeq]: '0',
    },
  });
  const producer = kafka.producer();
  await producer.connect();
  for (const topic of [stage, mirror])
    await producer.send({ topic, messages: [message('RI-X', xAt), message('RI-Y', yAt)] });
  await producer.disconnect();
  const group = `restored-time-${name}-${Date.now()}`;
  const consumer = createInboxConsumer({
    db: a.db,
    groupId: group,
    subscriber: createKafkaSubscriber({
      brokers: kafkaBrokers(),
      groupId: group,
      topics: [stage],
      fromBeginning: true,
    }),
    dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
    handler: async (trx, m) => {
      const u = await A.update({
        taskId: m.key!,
        expectedVersion: 1,
        patch: planApproved(),
        actor: AGENT,
        trx,
      });
      if (!u.ok) throw u.error;
    },
  });
  const consuming = consumer.run();
  try {
    await waitFor('region A applies both', async () => consumer.stats().applied === 2);
  } finally {
    await consumer.stop();
    await consuming;
  }
  await sql`DELETE FROM outbox WHERE task_id = 'RI-Y'`.execute(a.db);
  const relay = createRelay({ db: a.db, publisher: createKafkaPublisher({ brokers: kafkaBrokers() }) });
  const running = relay.run();
  try {
    await waitFor(
      'A outbox published',
      async () =>
        (await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox`.execute(a.db)).rows[0]!.n === 0,
    );
  } finally {
    await relay.stop();
    await running;
  }
  const replay = await replayChangelog(b.db, reader, {
    topic: changelog,
    actor: 'spiffe://acme.example/operator',
    deadlineMs: 30_000,
  });
  expect(replay).toMatchObject({ restoredInboxRows: 1 });
  return { a, b, group, mirror };
}

it('a restored message with a record time in the future does not hide the lost consumption of another', async () => {
  const { b, group, mirror } = await scenario('rts_future', Date.now() + 2 * 3600_000); // producer clock 2 h ahead
  const offsets = kafka.admin();
  await offsets.connect();
  await offsets.setOffsets({ groupId: group, topic: mirror, partitions: [{ partition: 0, offset: '2' }] });
  await offsets.disconnect();
  const report = await checkAfterFailover(b.db, reader, {
    topics: [mirror],
    consumers: [{ groupId: group, topics: [mirror] }],
    sourcePrefix: PREFIX,
  });
  expect(report.lostConsumptions.map((l) => [l.taskId, l.messageId])).toEqual([['RI-Y', 'go-RI-Y']]);
  expect(report.divergedTasks).toEqual(['RI-Y']);
});

it('a restored message with an old record time keeps its inbox row through pruning: region B does not apply it again', async () => {
  const { b, group, mirror } = await scenario('rts_old', Date.now() - 8 * 24 * 3600_000); // 8 days old (lag / clock behind)
  // Region A's own row for it says applied now: kept 7 more days there.
  const removed = await pruneInbox(b.db, { olderThanMs: 7 * 24 * 3600_000 }); // the consumer's default retention
  // Region B's agent starts from a lagging translated offset (0) on the mirror.
  let appliedAgainInB = 0;
  const consumer = createInboxConsumer({
    db: b.db,
    groupId: group,
    subscriber: createKafkaSubscriber({
      brokers: kafkaBrokers(),
      groupId: group,
      topics: [mirror],
      fromBeginning: true,
    }),
    dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
    handler: async (_trx, m) => {
      if (m.messageId === 'go-RI-X') appliedAgainInB++;
    },
  });
  const consuming = consumer.run();
  try {
    await waitFor(
      'B consumes the mirror',
      async () => consumer.stats().applied + consumer.stats().duplicates >= 2,
    );
  } finally {
    await consumer.stop();
    await consuming;
  }
  expect(removed).toBe(0);
  expect(appliedAgainInB).toBe(0);
});
