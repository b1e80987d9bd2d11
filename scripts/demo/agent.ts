/**
 * One demo agent process (planner, coder, reviewer or tester): an inbox consumer on its
 * stage's topic that advances tasks through the TaskState machine, flips gates, records
 * artifacts (checkpoints are taken at those boundaries), and, for the tester, runs the one
 * irreversible deploy per task through a receipt against the sink.
 *
 * Environment: DATABASE_URL, KAFKA_BROKERS, DEMO_RUN, DEMO_ROLE, SINK_URL; DEMO_SESSION_TIMEOUT_MS
 * (the Kafka session, default 3000) and DEMO_DEPLOY_LEASE_TTL_MS (default 2000): short, so that a
 * crash shows quickly in the demo; the chaos soak sets longer ones that fit a busy machine.
 * DEMO_CHANGELOG_TOPIC: every committed version also goes to this changelog topic (issue 20),
 * signed with CAIRN_CHECKPOINT_KEYS's ring when there is one.
 */
import { sql } from 'kysely';
import { checkpointKeysFromEnv } from '../../cli/checkpointKeys.js';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { createDb } from '../../src/db/database.js';
import { LeaseHeldError, LeaseLostError } from '../../src/errors.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createLogger } from '../../src/logger.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import type { TaskPatch } from '../../src/schemas/taskPatch.js';
import type { TaskStatus } from '../../src/schemas/taskState.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { connectionsFromEnv, countConsumerRestarts, runUntilSigterm } from './consumerProcess.js';
import { startDemoTracing } from './tracing.js';
import { ROLES, type Role, topicOf } from './workflow.js';

const run = process.env.DEMO_RUN!;
const role = process.env.DEMO_ROLE as Role;
const { databaseUrl, brokers } = connectionsFromEnv(`demo ${role}`);
const sink = process.env.SINK_URL!;
const workMs = Number(process.env.DEMO_WORK_MS ?? 300);
const sessionTimeoutMs = Number(process.env.DEMO_SESSION_TIMEOUT_MS ?? 3000);
const deployLeaseTtlMs = Number(process.env.DEMO_DEPLOY_LEASE_TTL_MS ?? 2000);
/** When set, every transition also publishes an event (keyed by task, ordered by version) to this topic. */
const eventsTopic = process.env.DEMO_EVENTS_TOPIC;
const spec = ROLES[role];
/**
 * DEMO_MIRROR_PREFIX (the failover harness's region B on its own cluster): also consume the
 * stage's topic as MirrorMaker 2 mirrored it (`A.<topic>`, messages published in region A) as
 * well as the local one (published by this region's relay after the failover). Each task sends
 * one message per stage, so order per key is not at stake between the two; a stale one is
 * refused by the task's version (CAS), a re-delivered one by the inbox.
 */
const mirrorPrefix = process.env.DEMO_MIRROR_PREFIX;
const topics = mirrorPrefix
  ? [`${mirrorPrefix}${topicOf(run, spec.from)}`, topicOf(run, spec.from)]
  : [topicOf(run, spec.from)];
const actor = `spiffe://demo.cairn.local/agents/${role}`;
const logger = createLogger({ name: `demo-${role}`, level: 'warn' });

// The demo's tracing (DEMO_TRACES): the handler's spans continue the trace each message carries.
if (process.env.DEMO_TRACES) startDemoTracing(process.env.DEMO_TRACES, role);

const db = createDb({
  connectionString: databaseUrl,
  max: 4,
  applicationName: `cairn-demo-${role}`,
});
// Signed when CAIRN_CHECKPOINT_KEYS names a key ring (kid:secret,...): verify and the console check them.
const checkpointKeys = checkpointKeysFromEnv(db);
const checkpointer = createCheckpointer({ db, ...checkpointKeys });
const changelogTopic = process.env.DEMO_CHANGELOG_TOPIC;
const store = createTaskStore({
  db,
  checkpointer,
  logger,
  ...(changelogTopic
    ? {
        changelog: {
          topic: changelogTopic,
          ...(checkpointKeys.keyRing ? { keyRing: checkpointKeys.keyRing } : {}),
        },
      }
    : {}),
});
const leases = createLeaseManager({ db });
const receipts = createReceiptStore({ db, checkpointer, worker: `${role}:${process.pid}` });

/**
 * A stale read or a held lease: try again shortly (the inbox retries, then redelivers). The
 * demo's own error: the inbox consumer retries any error whose `retriable` is not false.
 */
class RetryLater extends Error {
  readonly retriable = true;
}
const retryLater = (message: string) => new RetryLater(message);

/**
 * The deploy, once, under the task's deploy lease. The lease is renewed while the effect runs
 * (`withLease`): a tester that is alive but starved keeps it; one frozen or dead lets it lapse,
 * and the receipt's fence refuses it when it wakes.
 */
async function deploy(taskId: string): Promise<void> {
  try {
    await leases.withLease(
      { taskId, branch: 'deploy', agentId: `${role}:${process.pid}`, ttlMs: deployLeaseTtlMs },
      async (lease) => {
        const r = await receipts.runOnce({
          taskId,
          step: 'deploy',
          tool: 'deployer',
          args: { task: taskId, env: 'demo' },
          lease,
          irreversible: true,
          // The sink is an idempotent API (it dedupes by key): a retry after a crash is safe.
          onUncertain: 'retry',
          idempotentTool: true,
          effect: async ({ idempotencyKey }) => {
            const res = await fetch(`${sink}/apply?op=${encodeURIComponent(taskId)}`, {
              method: 'POST',
              headers: { 'idempotency-key': idempotencyKey },
            });
            if (!res.ok) throw new Error(`deploy sink answered ${res.status}`);
            return res.json();
          },
        });
        if (r.status !== 'succeeded') throw retryLater(`deploy of ${taskId} is ${r.status}`);
      },
    );
  } catch (err) {
    // Held by another tester (maybe a frozen one, until its lease lapses), or lapsed before the
    // effect ran (the fence working): try again; a dead letter here would strand the task.
    if (err instanceof LeaseHeldError || err instanceof LeaseLostError) {
      throw retryLater(`deploy of ${taskId}: ${err.message}`);
    }
    throw err;
  }
}

const consumer = createInboxConsumer({
  db,
  groupId: `demo-${run}-${role}`,
  subscriber: createKafkaSubscriber({
    brokers,
    groupId: `demo-${run}-${role}`,
    topics,
    sessionTimeoutMs,
    onRestart: countConsumerRestarts(db, logger),
    logger,
  }),
  dlqPublisher: createKafkaPublisher({ brokers }),
  logger,
  chunkSize: 5,
  // Contended work (a deploy lease held by a frozen tester) retries for minutes, not seconds,
  // before it is dead-lettered: on a busy machine 20 tries were used up in under a minute.
  maxAttempts: 100,
  retryBaseMs: 100,
  retryMaxMs: 2000,
  refuseStaleVersions: false,
  onCommitted: (c) => {
    if (c.duplicates > 0) {
      void sql`INSERT INTO demo_event (kind, n) VALUES ('duplicate_dropped', ${c.duplicates})`
        .execute(db)
        .catch(() => {});
    }
  },
  handler: async (trx, m) => {
    const taskId = m.key!;
    const task = await store.get(taskId, { trx });
    if (!task) throw new Error(`task ${taskId} does not exist`);
    if (task.status !== spec.from) return; // already past this stage: a redelivery, nothing to do
    // The agent's own work (a model call, tools): simulated, 0.5x to 1.5x DEMO_WORK_MS.
    await new Promise((r) => setTimeout(r, workMs * (0.5 + Math.random())));
    if (role === 'tester') await deploy(taskId);
    const patch: TaskPatch = {
      status: spec.to as TaskStatus,
      gates: spec.gates,
      artifacts: spec.artifacts(taskId),
      active_agents: [role],
      completed_agents: [...task.completed_agents, role],
      budget: {
        currency_spent_usd: task.budget.currency_spent_usd + 0.25,
        tokens_spent: task.budget.tokens_spent + 1000,
        hops_used: task.budget.hops_used + 1,
      },
    };
    const r = await store.update({
      taskId,
      expectedVersion: task.version,
      patch,
      actor,
      reason: `${role} finished ${spec.from}`,
      trx,
      messages: [
        ...(spec.to === 'complete'
          ? []
          : [{ topic: topicOf(run, spec.to), payload: { task: taskId, stage: spec.to } }]),
        ...(eventsTopic ? [{ topic: eventsTopic, payload: { task: taskId, status: spec.to } }] : []),
      ],
    });
    if (!r.ok) throw retryLater(r.error.message);
  },
});

await runUntilSigterm(consumer, {
  name: `demo ${role}`,
  db,
  groupId: `demo-${run}-${role}`,
  topics,
});
