import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { createRelay } from '../../relay/relay.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { resume, workflowDigestOf } from '../../src/recovery/resume.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { callSink, type Sink, startSink } from '../support/effectSink.js';
import { waitForLeaseExpiry } from '../support/leases.js';
import { spawnTs } from '../support/processes.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase, uniqueTopic } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

const WORKFLOW = { name: 'ship', steps: ['plan', 'implement', 'review', 'test', 'deploy'] };
let tdb: TestDatabase;
let sink: Sink;
beforeAll(async () => {
  tdb = await createTestDatabase('resume_e2e', { max: 12 });
  sink = await startSink();
  await sql`CREATE TABLE applied (grp text, message_id text, task text)`.execute(tdb.db);
});
afterAll(async () => {
  await sink.close();
  await tdb.drop();
});

describe('resume end to end (real processes, Postgres, Kafka)', () => {
  it('a worker killed after a boundary and before an irreversible effect resumes elsewhere: the effect runs once, its message reaches each consumer group once, the lowered budget limit holds', async () => {
    const topic = uniqueTopic('resume-e2e');
    const admin = kafkaClient(kafkaBrokers(), 'resume-e2e').admin();
    await admin.connect();
    await admin.createTopics({ topics: [{ topic, numPartitions: 2 }], waitForLeaders: true });
    await admin.disconnect();

    const checkpoints = createCheckpointer({ db: tdb.db });
    const store = createTaskStore({ db: tdb.db, checkpointer: checkpoints });
    await store.create({
      task: newTask('e2e', { workflow_digest: workflowDigestOf(WORKFLOW) }),
      actor: AGENT,
    });
    let v = 1;
    for (const patch of [
      { status: 'implementing' as const, gates: { plan_approved: true } },
      {
        status: 'reviewing' as const,
        gates: { implementation_complete: true },
        budget: { currency_spent_usd: 30 },
      },
    ]) {
      const r = await store.update({ taskId: 'e2e', expectedVersion: v, patch, actor: AGENT });
      if (!r.ok) throw r.error;
      v = r.state.version;
    }

    const child = spawnTs('worker-a', 'test/support/e2eWorker.ts', {
      DATABASE_URL: tdb.url,
      TASK: 'e2e',
      TOPIC: topic,
    });
    await child.exited;
    expect(child.proc.signalCode, child.output()).toBe('SIGKILL');
    const killedAt = await store.get('e2e');
    expect(killedAt).toMatchObject({ status: 'testing', gates: { review_passed: true } });
    expect((await checkpoints.list('e2e'))[0]!.checkpoint.reason).toBe('gate passed: review_passed');

    // Region of the living: a relay and two consumer groups.
    const relay = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      maxIdleMs: 50,
    });
    const relayRun = relay.run();
    const consumers = ['billing', 'notifier'].map((grp) =>
      createInboxConsumer({
        db: tdb.db,
        groupId: `${topic}.${grp}`,
        subscriber: createKafkaSubscriber({
          brokers: kafkaBrokers(),
          groupId: `${topic}.${grp}`,
          topics: [topic],
        }),
        dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        handler: async (trx, m) => {
          await sql`INSERT INTO applied VALUES (${grp}, ${m.messageId}, ${m.key})`.execute(trx);
        },
      }),
    );
    for (const c of consumers) void c.run();

    await waitForLeaseExpiry(tdb.db, 'e2e', 'main'); // worker-a's 5 s lease runs out
    const receipts = createReceiptStore({ db: tdb.db, checkpointer: checkpoints });
    const leases = createLeaseManager({ db: tdb.db });
    const opts = {
      db: tdb.db,
      store,
      checkpoints,
      receipts,
      leases,
      workflowDefinition: WORKFLOW,
      policy: async () => ({ version: 'policy-2', allowed: true, budgetLimitUsd: 40 }),
      actor: 'spiffe://acme.example/cairn/recovery',
      agentId: 'worker-b',
    };
    const plan = await resume('e2e', opts);
    expect(plan).toMatchObject({
      outcome: 'resumed',
      receipts: [],
      budget: { committedBefore: 100, committedAfter: 40, limit: 40 },
    });

    const deploy = () =>
      receipts.runOnce({
        taskId: 'e2e',
        step: 'deploy',
        tool: 'deployer',
        args: { env: 'prod' },
        lease: plan.lease!,
        irreversible: true,
        onUncertain: 'gate',
        effect: ({ idempotencyKey }) => callSink(sink.url, '/apply', 'e2e-deploy', idempotencyKey),
      });
    expect(await deploy()).toMatchObject({ status: 'succeeded', ran: true });
    expect(await deploy()).toMatchObject({ status: 'succeeded', ran: false });
    // The limit comes from the current policy, not from the checkpoint (which still says 100).
    await expect(
      store.update({
        taskId: 'e2e',
        expectedVersion: plan.state.version,
        patch: { budget: { currency_spent_usd: 45 } },
        actor: AGENT,
      }),
    ).rejects.toThrow(/must not exceed currency_committed_usd \(40\)/);
    const r = await store.update({
      taskId: 'e2e',
      expectedVersion: plan.state.version,
      patch: { status: 'complete', gates: { tests_passing: true }, budget: { currency_spent_usd: 39 } },
      actor: AGENT,
      lease: plan.lease!,
    });
    expect(r.ok).toBe(true);

    await waitFor('both groups to apply the message', async () => {
      const n = await sql<{ n: number }>`SELECT count(*)::int AS n FROM applied`.execute(tdb.db);
      return n.rows[0]!.n >= 2;
    });
    // Everything the relay published has been read and committed by both groups: a duplicate
    // delivery would have been applied by now.
    await waitFor(
      'the outbox to drain',
      async () => (await tdb.db.selectFrom('outbox').select('id').execute()).length === 0,
    );
    const check = kafkaClient(kafkaBrokers(), 'resume-e2e-lag').admin();
    await check.connect();
    try {
      const ends = await check.fetchTopicOffsets(topic);
      for (const grp of ['billing', 'notifier']) {
        await waitFor(`${grp} to commit to the end of the topic`, async () => {
          const [committed] = await check.fetchOffsets({ groupId: `${topic}.${grp}`, topics: [topic] });
          return ends.every(
            (e) =>
              Number(e.high) === 0 ||
              Number(committed!.partitions.find((p) => p.partition === e.partition)?.offset ?? -1) >=
                Number(e.high),
          );
        });
      }
    } finally {
      await check.disconnect();
    }
    const applied = await sql<{
      grp: string;
      n: number;
    }>`SELECT grp, count(*)::int AS n FROM applied GROUP BY grp ORDER BY grp`.execute(tdb.db);
    expect(applied.rows).toEqual([
      { grp: 'billing', n: 1 },
      { grp: 'notifier', n: 1 },
    ]);
    expect(sink.keysByOperation.get('e2e-deploy')?.size).toBe(1);
    expect(sink.calls).toBe(1);

    for (const c of consumers) await c.stop();
    await relay.stop();
    await relayRun;
  });
});
