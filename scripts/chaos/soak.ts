import type { Kafka } from 'kafkajs';
import { sql } from 'kysely';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { createDb, type Db } from '../../src/db/database.js';
import { migrateToLatest } from '../../src/db/migrate.js';
import { createKafkaAdmin } from '../../src/kafka/admin.js';
import { createTopicsAndWait } from '../../src/kafka/kafkajsAdmin.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { createDemoTask } from '../demo/tasks.js';
import type { Check } from '../demo/verify.js';
import { ROLES, type Role, topicOf } from '../demo/workflow.js';
import { startSink } from '../lib/effectSink.js';
import { createFaults, createFleet, type ProcessSpec, seeded } from '../lib/faults.js';
import { createScratchDatabase } from '../lib/scratchDatabase.js';
import { checkInvariants, STALE_WRITER } from './checker.js';
import { livenessCheck, separateInFlight, settle } from './settle.js';

export interface SoakOptions {
  minutes: number;
  seed: number;
  /** New tasks per second while faults are injected. */
  rate: number;
  workMs: number;
  /** Seconds to let the system settle (no faults) before the checker runs. */
  settleS: number;
  /** Milliseconds between faults. */
  faultEveryMs: number;
  /** The broker restarts at most once per this many seconds (it is down ~10 s each time). */
  brokerRestartEveryS: number;
  databaseUrl: string;
  database: string;
  kafkaBrokers: string;
  canRestartBroker: boolean;
  /** The local cluster's size (npm run chaos -- --brokers 3): a broker fault SIGKILLs one node. */
  clusterSize?: number;
  /**
   * TTL of the relays' lanes and the testers' deploy leases. Default CAIRN_CHAOS_LEASE_TTL_MS,
   * else 5000: on two busy cores a 2 s lease lapsed under live, merely slow holders (lanes lost
   * by a relay no fault had frozen).
   */
  leaseTtlMs?: number;
  /**
   * Kafka session of the agents and observers. Default CAIRN_CHAOS_SESSION_TIMEOUT_MS, else
   * 10000: kafkajs heartbeats only between batches, and with 3 s the broker expired live members
   * of every group on a busy machine (40 expirations in a soak that froze or killed about five consumers), each
   * a rebalance in which the group consumed nothing.
   */
  sessionTimeoutMs?: number;
  log: (line: string) => void;
}

export type FaultKind =
  | 'agent_kill'
  | 'relay_kill'
  | 'consumer_kill'
  | 'agent_pause'
  | 'relay_pause'
  | 'consumer_pause'
  | 'duplicate_delivery'
  | 'pg_terminate'
  | 'broker_restart'
  | 'stale_write';

export interface SoakResult {
  tasks: number;
  terminal: number;
  faults: Record<FaultKind, number>;
  /** Units of each fault: messages re-sent, sessions ended, stale writes refused. */
  injected: { duplicates: number; sessionsTerminated: number; staleRefused: number };
  /** Processes that exited without a fault telling them to (the harness restarted them). */
  unexpectedExits: number;
  /** Kafka consumers that crashed for good inside an agent or observer and were replaced. */
  consumersReplaced: number;
  checks: Check[];
  violations: number;
  /** Checks that could not run (a dependency did not answer): the run proved nothing there. */
  notChecked: number;
  seconds: number;
}

const STAGES = ['planning', 'implementing', 'reviewing', 'testing'];
/** How far past a lease or session a frozen process stays frozen (a long GC pause, a stalled VM). */
const PAST_MS = 1500;
const fromEnv = (name: string, fallback: number) => {
  const v = Number(process.env[name]);
  return Number.isFinite(v) && v > 0 ? v : fallback;
};
// A fault is drawn with these weights (the broker restarts at most every brokerRestartEveryS).
const WEIGHTS: Array<[FaultKind, number]> = [
  ['agent_kill', 4],
  ['relay_kill', 2],
  ['consumer_kill', 2],
  ['agent_pause', 2],
  ['relay_pause', 2],
  ['consumer_pause', 2],
  ['duplicate_delivery', 3],
  ['pg_terminate', 2],
  ['broker_restart', 1],
  ['stale_write', 3],
];

/**
 * The chaos soak: the demo workflow with two of every agent, two relays and two observer
 * consumer groups, new tasks arriving for `minutes`, and a fault every `faultEveryMs`; then
 * a settle phase without faults and the independent checker. Every process kind is both
 * killed (SIGKILL) and frozen (SIGSTOP past its lease or session, then SIGCONT).
 */
export async function runSoak(o: SoakOptions): Promise<SoakResult> {
  const { rand, pick } = seeded(o.seed);
  const leaseTtlMs = o.leaseTtlMs ?? fromEnv('CAIRN_CHAOS_LEASE_TTL_MS', 5000);
  /** Agents' and observers' Kafka session: a consumer frozen past it is dropped from its group. */
  const sessionTimeoutMs = o.sessionTimeoutMs ?? fromEnv('CAIRN_CHAOS_SESSION_TIMEOUT_MS', 10_000);
  o.log(`[chaos] leases ${leaseTtlMs} ms, Kafka sessions ${sessionTimeoutMs} ms`);
  const scratch = await createScratchDatabase(o.databaseUrl, o.database, { recreate: true });
  // A deadline, not a measure: at a load average of 80 to 99 a new connection took more than the
  // 5 s default ("Connection terminated due to connection timeout" from a fault and the checker),
  // and a slow server must not fail the checker as if a check had found a violation.
  const db = createDb({
    connectionString: scratch.url,
    max: 6,
    applicationName: 'cairn-chaos-orchestrator',
    connectionTimeoutMillis: 60_000,
  });
  await migrateToLatest(db);
  await sql`CREATE TABLE demo_event (kind text NOT NULL, n int NOT NULL, at timestamptz NOT NULL DEFAULT now())`.execute(
    db,
  );
  await sql`CREATE TABLE chaos_observed (seq bigserial PRIMARY KEY, consumer_group text NOT NULL, key text,
            version int, message_id text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`.execute(
    db,
  );
  const sink = await startSink();
  const run = `chaos-${o.seed}-${Date.now().toString(36)}`;
  const eventsTopic = topicOf(run, 'events');
  const kafka: Kafka = kafkaClient(o.kafkaBrokers.split(','), 'cairn-chaos');
  const admin = kafka.admin();
  await admin.connect();
  await createTopicsAndWait(
    admin,
    [...STAGES.map((s) => topicOf(run, s)), eventsTopic].map((topic) => ({ topic, numPartitions: 3 })),
  );
  await admin.disconnect();

  const env = {
    DATABASE_URL: scratch.url,
    KAFKA_BROKERS: o.kafkaBrokers,
    DEMO_RUN: run,
    SINK_URL: sink.url,
    CAIRN_RELAY_LEASE_TTL_MS: String(leaseTtlMs),
    CAIRN_RELAY_MAX_IDLE_MS: '50',
    DEMO_WORK_MS: String(o.workMs),
    DEMO_EVENTS_TOPIC: eventsTopic,
    DEMO_DEPLOY_LEASE_TTL_MS: String(leaseTtlMs),
    DEMO_SESSION_TIMEOUT_MS: String(sessionTimeoutMs),
  };
  const groups = [`${run}-observer-a`, `${run}-observer-b`];
  const specs: ProcessSpec[] = [
    ...[1, 2].map((n) => ({ name: `relay-${n}`, entry: 'relay/main.ts', env })),
    ...(Object.keys(ROLES) as Role[]).flatMap((role) =>
      [1, 2].map((n) => ({
        name: `${role}-${n}`,
        entry: 'scripts/demo/agent.ts',
        env: { ...env, DEMO_ROLE: role },
      })),
    ),
    ...[
      ['observer-a1', groups[0]!],
      ['observer-a2', groups[0]!],
      ['observer-b1', groups[1]!],
    ].map(([name, group]) => ({
      name: name!,
      entry: 'scripts/chaos/observer.ts',
      env: {
        ...env,
        CHAOS_GROUP: group!,
        CHAOS_TOPIC: eventsTopic,
        CHAOS_SESSION_TIMEOUT_MS: String(sessionTimeoutMs),
      },
    })),
  ];
  const fleet = createFleet(specs, {
    onUnexpectedExit: (name, code, tail) =>
      o.log(`[chaos] ${name} exited by itself (code ${code}); restarted. Its last output:\n${tail}`),
  });
  fleet.startAll();
  const byKind = {
    agent: fleet.names.filter((n) => !n.startsWith('relay') && !n.startsWith('observer')),
    relay: fleet.names.filter((n) => n.startsWith('relay')),
    consumer: fleet.names.filter((n) => n.startsWith('observer')),
  };
  const faults = createFaults({
    kafka,
    db,
    topics: [...STAGES.map((s) => topicOf(run, s)), eventsTopic],
    sessionPrefix: 'cairn-demo-',
    ownSession: 'cairn-chaos-orchestrator',
    pick,
    canRestartBroker: o.canRestartBroker,
    ...(o.clusterSize ? { clusterSize: o.clusterSize } : {}),
  });
  const counts = Object.fromEntries(WEIGHTS.map(([k]) => [k, 0])) as Record<FaultKind, number>;
  const injected = { duplicates: 0, sessionsTerminated: 0, staleRefused: 0 };
  const store = createTaskStore({ db, checkpointer: createCheckpointer({ db }), cacheSize: 0 });
  let lastBrokerRestart = Date.now();

  /** A writer that read a task, lost the race, and writes anyway with the old version. */
  async function staleWrite(): Promise<boolean> {
    const open = await db
      .selectFrom('task_state')
      .select(['task_id', 'version'])
      .where('status', 'not in', ['complete', 'failed', 'cancelled', 'expired'])
      .where('version', '>', 1)
      .limit(20)
      .execute();
    if (open.length === 0) return false;
    const t = pick(open);
    const r = await store.update({
      taskId: t.task_id,
      expectedVersion: t.version - 1,
      patch: { budget: { tokens_spent: 1e9 } },
      actor: STALE_WRITER,
      reason: 'chaos: a stale writer',
    });
    if (!r.ok && r.error.code === 'stale_version') injected.staleRefused++;
    return true;
  }

  // Every kind once first (in a seeded order; the broker as soon as its interval allows),
  // then drawn by weight: a short run still sees each kind.
  const firstRound = WEIGHTS.map(([k]) => k).filter((k) => k !== 'broker_restart');
  for (let i = firstRound.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [firstRound[i], firstRound[j]] = [firstRound[j]!, firstRound[i]!];
  }
  const brokerDue = () =>
    o.canRestartBroker && Date.now() - lastBrokerRestart >= o.brokerRestartEveryS * 1000;

  function draw(): FaultKind {
    if (counts.broker_restart === 0 && brokerDue()) return 'broker_restart';
    const next = firstRound.shift();
    if (next) return next;
    const total = WEIGHTS.reduce((n, [, w]) => n + w, 0);
    let x = rand() * total;
    for (const [k, w] of WEIGHTS) {
      x -= w;
      if (x < 0) return k === 'broker_restart' && !brokerDue() ? 'duplicate_delivery' : k;
    }
    return 'agent_kill';
  }

  async function fault(): Promise<void> {
    const kind = draw();
    switch (kind) {
      case 'agent_kill':
        await fleet.crash(pick(byKind.agent));
        break;
      case 'relay_kill':
        await fleet.crash(pick(byKind.relay));
        break;
      case 'consumer_kill':
        await fleet.crash(pick(byKind.consumer));
        break;
      case 'agent_pause': // past its deploy lease and its Kafka session both
        await fleet.pause(pick(byKind.agent), Math.max(leaseTtlMs, sessionTimeoutMs) + PAST_MS);
        break;
      case 'relay_pause': // its lanes expire and move to the other relay; its deletes are fenced off
        await fleet.pause(pick(byKind.relay), leaseTtlMs + PAST_MS);
        break;
      case 'consumer_pause': // its group rebalances without it; it rejoins when it wakes
        await fleet.pause(pick(byKind.consumer), sessionTimeoutMs + PAST_MS);
        break;
      case 'duplicate_delivery':
        injected.duplicates += await faults.duplicates(5);
        break;
      case 'pg_terminate':
        injected.sessionsTerminated += await faults.terminateSessions();
        break;
      case 'broker_restart':
        // Counted when attempted: on a starved machine the restarted broker may answer only
        // after the readiness wait gave up, and the restart is not tried again and again.
        counts.broker_restart++;
        lastBrokerRestart = Date.now();
        await faults.restartBroker();
        return;
      case 'stale_write':
        if (!(await staleWrite())) {
          if (counts.stale_write === 0) firstRound.push('stale_write'); // no task to race yet: later
          return;
        }
        break;
    }
    counts[kind]++;
  }

  const startedAt = Date.now();
  const chaosUntil = startedAt + o.minutes * 60_000;
  let created = 0;
  const progress = async (phase: string) => {
    const rows = await sql<{ status: string; n: number }>`SELECT status, count(*)::int AS n FROM task_state
        WHERE task_id LIKE 'demo-%' GROUP BY status`
      .execute(db)
      .catch(() => ({ rows: [] as Array<{ status: string; n: number }> }));
    const by = Object.fromEntries(rows.rows.map((r) => [r.status, r.n]));
    const nFaults = Object.values(counts).reduce((a, b) => a + b, 0);
    o.log(
      `[chaos] ${phase} ${Math.round((Date.now() - startedAt) / 1000)}s | tasks ${created} complete ${by.complete ?? 0} ` +
        `${STAGES.map((s) => `${s.slice(0, 4)} ${by[s] ?? 0}`).join(' ')} | faults ${nFaults}`,
    );
  };

  // --- faults and arrivals ----------------------------------------------------------------
  const creator = (async () => {
    while (Date.now() < chaosUntil) {
      await createDemoTask(db, store, run, created).then(
        () => created++,
        (e: Error) => o.log(`[chaos] task creation failed, retrying: ${e.message}`),
      );
      await new Promise((r) => setTimeout(r, 1000 / o.rate));
    }
  })();
  let lastProgress = 0;
  // A short run on a busy machine may not reach every kind of fault in its minutes: it goes
  // on (for up to four times as long) until each kind happened once.
  const everyKind = () =>
    WEIGHTS.every(([k]) => counts[k] > 0 || (k === 'broker_restart' && !o.canRestartBroker));
  const faultsUntil = chaosUntil + 4 * o.minutes * 60_000;
  while (Date.now() < chaosUntil || (!everyKind() && Date.now() < faultsUntil)) {
    await new Promise((r) => setTimeout(r, o.faultEveryMs));
    await fault().catch((e: Error) => o.log(`[chaos] fault failed: ${e.message}`));
    if (Date.now() - lastProgress > 10_000) {
      await progress('faults');
      lastProgress = Date.now();
    }
  }
  await creator;

  // --- settle ---------------------------------------------------------------------------------
  const inFlight = await settle(db, groups, o.settleS, {
    log: o.log,
    tick: async () => {
      if (Date.now() - lastProgress > 10_000) {
        await progress('settling');
        lastProgress = Date.now();
      }
    },
  });
  await progress('settled');
  o.log(`[chaos] faults injected: ${JSON.stringify(counts)}`);

  // --- the independent checker ------------------------------------------------------------
  let checks: Check[];
  const reader = createKafkaAdmin({ brokers: o.kafkaBrokers.split(','), clientId: 'cairn-chaos-checker' });
  try {
    checks = await checkInvariants({
      db,
      kafka: reader,
      sink,
      eventsTopic,
      observerGroups: groups,
      holderAlive: fleet.holderAlive,
      leaseTtlMs,
    });
  } finally {
    await reader.close().catch(() => {});
    await fleet.stopAll();
    await faults.close();
  }
  checks = [livenessCheck(inFlight), ...separateInFlight(checks, inFlight)];
  const consumersReplaced = (
    await sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM demo_event WHERE kind = 'consumer_replaced'`.execute(db)
  ).rows[0]!.n;
  const terminal = (
    await sql<{ n: number }>`SELECT count(*)::int AS n FROM task_state
      WHERE task_id LIKE 'demo-%' AND status IN ('complete','failed','cancelled','expired')`.execute(db)
  ).rows[0]!.n;
  await sink.close();
  await closeQuietly(db);
  return {
    tasks: created,
    terminal,
    faults: counts,
    injected,
    unexpectedExits: fleet.unexpectedExits(),
    consumersReplaced,
    checks,
    violations: checks.reduce((n, c) => n + c.violations, 0),
    notChecked: checks.filter((c) => c.notChecked).length,
    seconds: Math.round((Date.now() - startedAt) / 1000),
  };
}

async function closeQuietly(db: Db): Promise<void> {
  await db.destroy().catch(() => {});
}
