/**
 * `npm run demo -- [--tasks 100] [--chaos off|low|high] [--seed 1] [--timeout 170] [--work-ms 300]`
 *
 * Agents that crash, retry and receive duplicates, and a workflow that still ends right:
 * the relay and four agents (planner, coder, reviewer, tester) run as separate processes;
 * the demo kills them at random (and, on high, the broker and Postgres sessions), restarts
 * them, injects duplicate deliveries, and at the end checks the outcome from the database
 * and the deploy sink. The last line is a JSON summary; the exit code is 1 on any violation.
 */
import { join } from 'node:path';
import { trace } from '@opentelemetry/api';
import { sql } from 'kysely';
import { z } from 'zod';
import { databaseFlag, numberFlag, parseScriptArgs } from '../cli/parseScriptArgs.js';
import { localBrokerStillRunning } from '../cli/stack/kafka.js';
import { stackDir } from '../cli/stack/paths.js';
import { resolveStack } from '../cli/stack/resolve.js';
import { createDb } from '../src/db/database.js';
import { migrateToLatest } from '../src/db/migrate.js';
import { createTopicsAndWait } from '../src/kafka/kafkajsAdmin.js';
import { kafkaClient } from '../src/kafka/publisher.js';
import { createTaskStore } from '../src/state/taskStore.js';
import { createDemoTask, demoTaskId } from './demo/tasks.js';
import { readSpans, startDemoTracing } from './demo/tracing.js';
import { verdict, verifyDemo } from './demo/verify.js';
import { ROLES, type Role, topicOf } from './demo/workflow.js';
import { startSink } from './lib/effectSink.js';
import { createFaults, createFleet, seeded } from './lib/faults.js';
import { createScratchDatabase } from './lib/scratchDatabase.js';

const args = parseScriptArgs({
  name: 'demo',
  usage: `usage: npm run demo -- [flags]

Agents that crash, retry and receive duplicates, and a workflow that still ends right. Starts
the local stack unless DATABASE_URL / KAFKA_BROKERS are set; the last line is a JSON summary;
exit 1 on any violation.

flags:
  --tasks N             tasks to run through the workflow (100)
  --chaos off|low|high  faults: none; agent kills and duplicates; also Postgres sessions
                        and a broker restart (low)
  --seed S              fixes which faults happen in which order (1)
  --work-ms M           simulated agent work per step, in ms (300)
  --timeout S           give up after S seconds (170)
  --database NAME       the scratch database, dropped and created again (cairn_demo)
  --help                this text`,
  options: {
    tasks: { type: 'string', default: '100' },
    chaos: { type: 'string', default: 'low' },
    seed: { type: 'string', default: '1' },
    timeout: { type: 'string', default: '170' },
    'work-ms': { type: 'string', default: '300' },
    database: { type: 'string', default: 'cairn_demo' },
  },
  schema: z.strictObject({
    tasks: numberFlag({ above: 0 }, { integer: true }),
    chaos: z.enum(['off', 'low', 'high']),
    seed: numberFlag({ atLeast: 0 }, { integer: true }),
    timeout: numberFlag({ above: 0 }),
    'work-ms': numberFlag({ atLeast: 0 }),
    database: databaseFlag,
  }),
});
const TASKS = args.tasks;
const CHAOS = args.chaos;
const TIMEOUT_S = args.timeout;
const { pick } = seeded(args.seed || 1);
const log = (line: string) => process.stderr.write(`${line}\n`);

// --- stack, database, sink -------------------------------------------------------------
const stack = await resolveStack((l) => log(`[stack] ${l}`));
const { url: databaseUrl } = await createScratchDatabase(stack.databaseUrl, args.database, {
  recreate: true,
});
const db = createDb({ connectionString: databaseUrl, max: 6, applicationName: 'cairn-demo-orchestrator' });
await migrateToLatest(db);
await sql`CREATE TABLE demo_event (kind text NOT NULL, n int NOT NULL, at timestamptz NOT NULL DEFAULT now())`.execute(
  db,
);
const sink = await startSink();
const run = `${args.seed}-${Date.now().toString(36)}`;
const kafka = kafkaClient(stack.kafkaBrokers.split(','), 'cairn-demo');
const admin = kafka.admin();
await admin.connect();
await createTopicsAndWait(
  admin,
  ['planning', 'implementing', 'reviewing', 'testing'].map((s) => ({
    topic: topicOf(run, s),
    numPartitions: 3,
  })),
);
await admin.disconnect();

// --- processes ---------------------------------------------------------------------------
// Every process writes its spans here: one task's trace can be followed through all of them.
const traces = join(stackDir, 'demo-traces', run);
const tracing = startDemoTracing(traces, 'orchestrator');
const env = {
  DEMO_TRACES: traces,
  DATABASE_URL: databaseUrl,
  KAFKA_BROKERS: stack.kafkaBrokers,
  DEMO_RUN: run,
  SINK_URL: sink.url,
  CAIRN_RELAY_LEASE_TTL_MS: '2000',
  CAIRN_RELAY_MAX_IDLE_MS: '50',
  DEMO_WORK_MS: String(args['work-ms']),
};
const fleet = createFleet(
  ['relay', ...(Object.keys(ROLES) as Role[])].map((name) => ({
    name,
    entry: name === 'relay' ? 'scripts/demo/relayProcess.ts' : 'scripts/demo/agent.ts',
    env: { ...env, DEMO_ROLE: name },
  })),
);
fleet.startAll();

// --- tasks -------------------------------------------------------------------------------
const store = createTaskStore({ db });
// Each task starts in a span of its own: its first message carries the trace to the planner.
const tracer = trace.getTracer('cairn-demo');
const traceOf = new Map<string, string>();
for (let i = 0; i < TASKS; i++) {
  await tracer.startActiveSpan(`demo.start ${demoTaskId(i)}`, async (span) => {
    traceOf.set(demoTaskId(i), span.spanContext().traceId);
    await createDemoTask(db, store, run, i);
    span.end();
  });
}

// --- chaos -------------------------------------------------------------------------------
let crashes = 0;
let duplicatesInjected = 0;
let backendsKilled = 0;
let brokerRestarts = 0;
let chaosOn = CHAOS !== 'off';
const faults = createFaults({
  kafka,
  db,
  topics: ['planning', 'implementing', 'reviewing', 'testing'].map((s) => topicOf(run, s)),
  sessionPrefix: 'cairn-demo-',
  ownSession: 'cairn-demo-orchestrator',
  pick,
  canRestartBroker: stack.source.kafka.startsWith('local'),
});

// Faults in a fixed rotation (victims and counts drawn from the seed), so every kind happens.
const ROTATION = {
  low: ['kill', 'duplicate', 'kill'],
  high: ['kill', 'duplicate', 'kill', 'pg', 'kill', 'duplicate', 'broker', 'kill', 'pg'],
} as const;
let step = 0;

async function chaosStep(): Promise<void> {
  if (CHAOS === 'off') return;
  const rotation = ROTATION[CHAOS];
  const kind = rotation[step++ % rotation.length];
  if (kind === 'kill') {
    await fleet.crash(pick(fleet.names));
    crashes++;
  } else if (kind === 'duplicate') {
    duplicatesInjected += await faults.duplicates(CHAOS === 'high' ? 5 : 2);
  } else if (kind === 'pg') {
    backendsKilled += await faults.terminateSessions();
  } else if (kind === 'broker' && brokerRestarts === 0) {
    brokerRestarts += await faults.restartBroker();
  }
}

const chaosLoop = (async () => {
  const every = CHAOS === 'high' ? 800 : 2000;
  while (chaosOn) {
    await new Promise((r) => setTimeout(r, every));
    if (chaosOn) await chaosStep().catch((e: Error) => log(`[chaos] ${e.message}`));
  }
})();

// --- progress ------------------------------------------------------------------------------
const startedAt = Date.now();
const tty = process.stderr.isTTY;
let lastLine = 0;
let statuses: Record<string, number> = {};
for (;;) {
  const rows = await sql<{
    status: string;
    n: number;
  }>`SELECT status, count(*)::int AS n FROM task_state GROUP BY status`
    .execute(db)
    .catch(() => ({ rows: [] as Array<{ status: string; n: number }> }));
  statuses = Object.fromEntries(rows.rows.map((r) => [r.status, r.n]));
  const backlog = await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox`
    .execute(db)
    .catch(() => ({ rows: [{ n: -1 }] }));
  const dups = await sql<{
    n: number;
  }>`SELECT coalesce(sum(n), 0)::int AS n FROM demo_event WHERE kind = 'duplicate_dropped'`
    .execute(db)
    .catch(() => ({ rows: [{ n: 0 }] }));
  const elapsed = (Date.now() - startedAt) / 1000;
  const done = statuses.complete ?? 0;
  const bar = '#'.repeat(Math.round((done / TASKS) * 20)).padEnd(20, '.');
  const line =
    `[${bar}] ${done}/${TASKS} complete | ` +
    ['planning', 'implementing', 'reviewing', 'testing']
      .map((s) => `${s.slice(0, 4)} ${statuses[s] ?? 0}`)
      .join(' ') +
    ` | outbox ${backlog.rows[0]!.n} | deploys ${sink.applied.size} | crashes ${crashes} dup-injected ${duplicatesInjected} ` +
    `dup-dropped ${dups.rows[0]!.n}${backendsKilled ? ` pg-killed ${backendsKilled}` : ''}${brokerRestarts ? ' broker-restarted' : ''} | ${elapsed.toFixed(0)}s`;
  if (tty) process.stderr.write(`\r${line.padEnd(150)}`);
  else if (Date.now() - lastLine > 5000) {
    log(line);
    lastLine = Date.now();
  }
  const terminal = ['complete', 'failed', 'cancelled', 'expired'].reduce((n, s) => n + (statuses[s] ?? 0), 0);
  if (terminal >= TASKS && backlog.rows[0]!.n === 0) break;
  if (elapsed > TIMEOUT_S) {
    log(`\n[demo] timeout after ${TIMEOUT_S}s`);
    break;
  }
  // Stop injecting faults near the end so the run can settle.
  if (chaosOn && done >= TASKS * 0.9) chaosOn = false;
  await new Promise((r) => setTimeout(r, 1000));
}
if (tty) process.stderr.write('\n');
chaosOn = false;
await chaosLoop;
await new Promise((r) => setTimeout(r, 1000)); // let in-flight duplicates land

// --- verify --------------------------------------------------------------------------------
await fleet.stopAll();
await faults.close();
const checks = await verifyDemo(db, sink, TASKS);
const dups = await sql<{
  n: number;
}>`SELECT coalesce(sum(n), 0)::int AS n FROM demo_event WHERE kind = 'duplicate_dropped'`.execute(db);
const violations = checks.reduce((n, c) => n + c.violations, 0);
await tracing.shutdown();
const firstTask = demoTaskId(0);
const traceId = traceOf.get(firstTask)!;
// The task's own trace, and the relay's batch spans that link to it (a batch carries many tasks' messages).
const spans = readSpans(traces).filter((sp) => sp.traceId === traceId || sp.links.includes(traceId));
const processes = [...new Set(spans.map((sp) => sp.process))].sort();
console.log('');
console.log(
  `trace of ${firstTask}: ${traceId} (${spans.length} spans in ${processes.length} processes: ${processes.join(', ')}); ` +
    `look it up: grep ${traceId} ${traces}/*.jsonl`,
);
console.log(`${'check'.padEnd(42)} ${'expected'.padEnd(16)} ${'actual'.padEnd(22)} result`);
for (const c of checks) {
  console.log(`${c.name.padEnd(42)} ${c.expected.padEnd(16)} ${c.actual.padEnd(22)} ${verdict(c)}`);
}
const summary = {
  demo: true,
  tasks: TASKS,
  complete: statuses.complete ?? 0,
  violations,
  crashes_injected: crashes,
  restarts: crashes,
  duplicates_injected: duplicatesInjected,
  duplicates_dropped: dups.rows[0]!.n,
  backends_killed: backendsKilled,
  broker_restarts: brokerRestarts,
  deploys_executed: [...sink.applied.values()].reduce((a, b) => a + b, 0),
  seconds: Math.round((Date.now() - startedAt) / 1000),
  chaos: CHAOS,
  seed: args.seed,
  trace: { task: firstTask, trace_id: traceId, spans: spans.length, processes },
};
await sink.close();
await db.destroy();
await stack.stop();
const brokerNote = localBrokerStillRunning(stack.kafkaBrokers, {
  startedByThisRun: stack.localKafka?.started === true,
});
if (brokerNote) log(`[demo] ${brokerNote}`);
console.log(JSON.stringify(summary));
process.exit(violations === 0 ? 0 : 1);
