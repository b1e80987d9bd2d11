/**
 * `npm run example:langgraph -- --thread T` (or `npx tsx examples/langgraph/main.ts --thread T`):
 * runs the graph of graph.ts for task T, or resumes it from its newest verified checkpoint when
 * an earlier run of T died. The last line on stdout is a JSON summary.
 *
 * In an application the imports below are `@cairn-state/cairn`, `@cairn-state/cairn/langgraph`
 * and `@cairn-state/cairn/relay`; here they point at this repository's entry points.
 */
import { Kafka, logLevel } from 'kafkajs';
import { z } from 'zod';
import { numberFlag, parseScriptArgs } from '../../cli/parseScriptArgs.js';
import { CairnSaver } from '../../langgraph/index.js';
import { createKafkaPublisher, createRelay, type Relay } from '../../relay/index.js';
import { startSink } from '../../scripts/lib/effectSink.js';
import {
  CairnError,
  createDb,
  createLeaseManager,
  createOutbox,
  createReceiptStore,
  createTaskStore,
  type Db,
  migrateToLatest,
  type TaskStore,
  workflowDigestOf,
} from '../../src/index.js';
import { buildGraph } from './graph.js';
import { AGENTS, checkKillPoint } from './killPoints.js';

const args = parseScriptArgs({
  name: 'example:langgraph',
  usage: `usage: npm run example:langgraph -- [flags]

A LangGraph graph (planner, coder, reviewer, tester, deploy) persisted by CairnSaver; each node
moves the task through TaskState by compare-and-swap and enqueues an outbox message; the deploy
runs once through a tool receipt. Run it again with the same --thread after a crash to resume.
CAIRN_EXAMPLE_KILL_AT=<point> makes it SIGKILL itself there (see killPoints.ts).

flags:
  --thread ID        the LangGraph thread, and the Cairn task it works on (example-1)
  --database-url U   Postgres (default: DATABASE_URL); migrated to the latest schema first
  --brokers B        Kafka host:port list (default: KAFKA_BROKERS); without it the outbox
                     keeps the messages for a relay (cairn relay) to publish
  --topic T          topic of the task's messages (cairn.example.langgraph)
  --deploy-url U     the deploy API (POST /apply?op=..., idempotency-key header); without it a
                     stand-in runs in this process
  --deploy-lease-ms M  deploy lease time to live (2000)
  --help             this text`,
  options: {
    thread: { type: 'string', default: 'example-1' },
    'database-url': { type: 'string', default: process.env.DATABASE_URL ?? '' },
    brokers: { type: 'string', default: process.env.KAFKA_BROKERS ?? '' },
    topic: { type: 'string', default: 'cairn.example.langgraph' },
    'deploy-url': { type: 'string', default: '' },
    'deploy-lease-ms': { type: 'string', default: '2000' },
  },
  schema: z.strictObject({
    thread: z
      .string()
      .regex(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$/, { message: 'must be a task id: A-Z a-z 0-9 . _ : -' }),
    'database-url': z.string().min(1, { message: 'is required (or set DATABASE_URL)' }),
    brokers: z.string(),
    topic: z.string().regex(/^[A-Za-z0-9._-]{1,249}$/, { message: 'must be a Kafka topic name' }),
    'deploy-url': z.union([z.literal(''), z.url()]),
    'deploy-lease-ms': numberFlag({ atLeast: 100 }, { integer: true }),
  }),
});
const log = (line: string) => process.stderr.write(`[example] ${line}\n`);

checkKillPoint();
const taskId = args.thread;
const db = createDb({
  connectionString: args['database-url'],
  max: 6,
  applicationName: 'cairn-example-langgraph',
});
await migrateToLatest(db);
const store = createTaskStore({ db });
await createTaskOnce(db, store);

const sink = args['deploy-url'] ? undefined : await startSink();
const relay = args.brokers ? await startRelay(db, args.brokers.split(','), args.topic) : undefined;
const saver = new CairnSaver({ db });
const graph = buildGraph({
  store,
  receipts: createReceiptStore({ db }),
  leases: createLeaseManager({ db }),
  checkpointer: saver,
  topic: args.topic,
  deployUrl: args['deploy-url'] || sink!.url,
  deployLeaseMs: args['deploy-lease-ms'],
});

// 'sync': a step's checkpoint is stored before the next step starts, so a kill between steps
// loses no step that finished.
const config = { configurable: { thread_id: taskId }, durability: 'sync' as const };
const head = await saver.getTuple(config);
let resumedFrom: { checkpointId: string; step: number; next: string[] } | undefined;
if (!head) {
  log(`thread ${taskId}: new run`);
  await graph.invoke({ taskId, taskVersion: 1 }, config);
} else {
  // The tasks of the step after the head, with those that saved their writes (LangGraph's
  // `next` leaves those out, and is empty when every task of the step saved its writes).
  const before = await graph.getState(config);
  if (before.tasks.length > 0) {
    resumedFrom = {
      checkpointId: String(head.config.configurable?.checkpoint_id),
      step: head.metadata?.step ?? -1,
      next: before.tasks.map((t) => t.name),
    };
    log(
      `thread ${taskId}: resuming from checkpoint ${resumedFrom.checkpointId} (step ${resumedFrom.step}) at ${resumedFrom.next.join(', ')}`,
    );
    await graph.invoke(null, config);
  } else {
    log(`thread ${taskId}: already finished`);
  }
}

const final = await graph.getState(config);
const task = await store.get(taskId);
const published = relay ? await drainOutbox(db, relay) : false;
const summary = {
  thread: taskId,
  resumedFrom: resumedFrom ?? null,
  finished: final.tasks.length === 0,
  status: task?.status,
  version: task?.version,
  stepsDone: AGENTS.filter((a) => final.values.answers?.[a] !== undefined),
  deployment: final.values.deployment ?? null,
  outboxPublished: published,
};
await sink?.close();
await db.destroy();
console.log(JSON.stringify(summary));
process.exit(summary.finished && task?.status === 'complete' ? 0 : 1);

/** Creates the task in `planning` with its first outbox message, unless an earlier run did. */
async function createTaskOnce(db: Db, store: TaskStore): Promise<void> {
  if (await store.get(taskId)) return;
  try {
    await db.transaction().execute(async (trx) => {
      await store.create({
        task: {
          tenant_id: 'example',
          task_id: taskId,
          workflow_digest: workflowDigestOf({ graph: 'examples/langgraph', agents: AGENTS }),
          intent_id: `intent-${taskId}`,
          budget: { currency_committed_usd: 1, currency_spent_usd: 0, tokens_spent: 0, hops_used: 0 },
        },
        actor: 'spiffe://example.cairn.local/orchestrator',
        trx,
      });
      await createOutbox().enqueue(
        trx,
        [
          {
            topic: args.topic,
            key: taskId,
            payload: { task: taskId, status: 'planning', by: 'orchestrator' },
          },
        ],
        { taskId, taskVersion: 1, tenantId: 'example' },
      );
    });
  } catch (err) {
    if (!(err instanceof CairnError && err.code === 'already_exists')) throw err;
  }
}

/** A relay in this process, publishing the outbox to Kafka while the graph runs. */
async function startRelay(db: Db, brokers: string[], topic: string): Promise<Relay> {
  const admin = new Kafka({ brokers, clientId: 'cairn-example', logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 1 }], waitForLeaders: true });
  await admin.disconnect();
  // A short lane lease: a killed run's relay holds its lanes this long before the next one takes them.
  const relay = createRelay({
    db,
    publisher: createKafkaPublisher({ brokers }),
    leaseTtlMs: 2000,
    maxIdleMs: 50,
  });
  relay.run().catch((err: Error) => log(`relay stopped: ${err.message}`));
  return relay;
}

/** Waits until the relay has published every message of the task (deleted from the outbox), then stops it. */
async function drainOutbox(db: Db, relay: Relay): Promise<boolean> {
  const until = Date.now() + 60_000;
  let left = Number.POSITIVE_INFINITY;
  while (left > 0 && Date.now() < until) {
    const row = await db
      .selectFrom('outbox')
      .select((eb) => eb.fn.countAll<string>().as('n'))
      .where('task_id', '=', taskId)
      .executeTakeFirstOrThrow();
    left = Number(row.n);
    if (left > 0) await new Promise((r) => setTimeout(r, 100));
  }
  await relay.stop();
  return left === 0;
}
