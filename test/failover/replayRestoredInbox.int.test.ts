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
import { AGENT, newTask } from '../state/fixtures.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
  uniqueTopic,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { runRegionAAgent } from './regionAgent.js';

// The lagging-mirror failover that left a task stuck and not held: region A's agent consumed two
// old stage messages after the cut; MirrorMaker had mirrored the changelog record of one task
// (rebuilt, its inbox row restored) but nothing new of the other, and had translated the group's
// offset past both. The check's pruning horizon (the group's oldest inbox row, failoverMirror.ts)
// came from the restored row, stamped with the replay's time: the other task's lost consumption
// was taken for pruned, and region B's agent, starting after the message, never got it. Nor may a
// message's record time, which its producer chooses, make region B apply a message twice or hide
// a loss (the second review's findings, when restored rows took the message's time).

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
  // Region A alone: its agent applies both (each moves its task on in the inbox transaction).
  const group = await runRegionAAgent({ db: a.db, store: A, topic: stage, applied: 2 });
  // RI-Y's changelog record never reaches region B (the mirror lagged): as if never published.
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

it('an inbox row the replay restores does not move the pruning horizon: an older lost consumption of the group is still reported and its task held', async () => {
  const sent = Date.now() - 5 * 60_000;
  const { b, group, mirror } = await scenario('ri_recent', sent);
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
  // The restored row carries the replay's time (pruning keeps it a full retention from now).
  const rows = await b.db.selectFrom('inbox').select(['message_id', 'applied_at']).execute();
  expect(rows.map((r) => r.message_id)).toEqual(['go-RI-X']);
  expect(rows[0]!.applied_at.getTime()).toBeGreaterThan(sent);
});

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
