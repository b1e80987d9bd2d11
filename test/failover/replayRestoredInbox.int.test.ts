import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createRelay } from '../../relay/relay.js';
import { createKafkaAdmin } from '../../src/kafka/admin.js';
import { createTopicsAndWait } from '../../src/kafka/kafkajsAdmin.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
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
// then came from the restored row, stamped with the replay's time: the other task's lost
// consumption was taken for pruned, and region B's agent, starting after the message, never got it.

const PREFIX = 'A.';
let a: TestDatabase;
let b: TestDatabase;
const kafka = kafkaClient(kafkaBrokers(), 'replay-restored-inbox');
const reader = createKafkaAdmin({ brokers: kafkaBrokers(), clientId: 'replay-restored-inbox-reader' });
const clock = () => new Date('2026-12-01T00:00:00.000Z');

beforeAll(async () => {
  [a, b] = await Promise.all([
    createTestDatabase('restored_inbox_a'),
    createTestDatabase('restored_inbox_b'),
  ]);
});
afterAll(async () => {
  await reader.close();
  await a?.drop();
  await b?.drop();
});

it('an inbox row the replay restores keeps its message time: an older lost consumption of the group is still reported and its task held', async () => {
  const changelog = await createTestTopic('restored-inbox-changelog', 1);
  const stage = uniqueTopic('restored-inbox-stage');
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
  // Both regions up to the cut.
  for (const s of [A, B])
    for (const id of ['RI-X', 'RI-Y']) await s.create({ task: newTask(id), actor: AGENT });
  await sql`DELETE FROM outbox`.execute(a.db);

  // Two stage messages published five minutes ago, in region A and (copied) on the mirror.
  const sent = Date.now() - 5 * 60_000;
  const message = (taskId: string) => ({
    key: taskId,
    value: '{}',
    timestamp: String(sent),
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
    await producer.send({ topic, messages: [message('RI-X'), message('RI-Y')] });
  await producer.disconnect();

  // Region A alone: its agent applies both (each moves its task on in the inbox transaction).
  const group = await runRegionAAgent({ db: a.db, store: A, topic: stage, applied: 2 });
  // RI-Y's changelog record never reaches region B (the mirror lagged): as if never published.
  await sql`DELETE FROM outbox WHERE task_id = 'RI-Y'`.execute(a.db);
  const relay = createRelay({ db: a.db, publisher: createKafkaPublisher({ brokers: kafkaBrokers() }) });
  const running = relay.run();
  try {
    await waitFor(
      "region A's outbox to be published",
      async () =>
        (await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox`.execute(a.db)).rows[0]!.n === 0,
    );
  } finally {
    await relay.stop();
    await running;
  }

  // Region B: the replay rebuilds RI-X and restores its inbox row.
  const replay = await replayChangelog(b.db, reader, {
    topic: changelog,
    actor: 'spiffe://acme.example/operator',
    deadlineMs: 30_000,
  });
  expect(replay).toMatchObject({ rebuilt: [{ taskId: 'RI-X', from: 1, to: 2 }], restoredInboxRows: 1 });

  // MirrorMaker translated the group's offset past both messages on the mirror.
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
  // The restored row carries the replay's time (pruning keeps it a full retention from now); the
  // check no longer reads a pruning horizon out of it alone (restoredInboxTime.int.test.ts).
  const rows = await b.db.selectFrom('inbox').select(['message_id', 'applied_at']).execute();
  expect(rows.map((r) => r.message_id)).toEqual(['go-RI-X']);
  expect(rows[0]!.applied_at.getTime()).toBeGreaterThan(sent);
});
