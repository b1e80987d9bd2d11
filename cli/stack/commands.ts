/** `up`, `down` and `status` of the local stack, shared by `npm run stack:*` and `cairn stack`. */
import { clusterNodes, nodePid, stopLocalCluster } from './cluster.js';
import { isAlive, KAFKA_VERSION, kafkaAnswers, localBrokers, readPid, stopLocalKafka } from './kafka.js';
import { kafkaPaths } from './paths.js';
import { localDatabaseUrl, postgresAnswers, redactUrl } from './postgres.js';
import { resolveStack } from './resolve.js';

const log = (line: string) => console.log(`[cairn stack] ${line}`);

/** Starts the local stack; `brokers` > 1 (or CAIRN_KAFKA_BROKERS_LOCAL) starts a local cluster instead of one broker. */
export async function up(brokers?: number): Promise<void> {
  process.env.CAIRN_STACK = 'local';
  if (brokers !== undefined) process.env.CAIRN_KAFKA_BROKERS_LOCAL = String(brokers);
  const stack = await resolveStack(log);
  log(`postgres: ${redactUrl(stack.databaseUrl)} (${stack.source.postgres})`);
  log(`kafka:    ${stack.kafkaBrokers} (${stack.source.kafka})`);
  console.log(`export DATABASE_URL=${stack.databaseUrl}`);
  console.log(`export KAFKA_BROKERS=${stack.kafkaBrokers}`);
}

export async function down(): Promise<void> {
  const stopped = await stopLocalKafka();
  const nodes = await stopLocalCluster(30_000);
  log(stopped ? 'Kafka broker stopped' : 'no local Kafka broker was running');
  if (nodes > 0) log(`${nodes} node(s) of the local Kafka cluster stopped`);
}

/** What `cairn stack status` finds; `--json` prints it as it is. */
export interface StackStatus {
  /** Postgres answers, and so does every Kafka broker (the local one: the one this stack started). */
  ok: boolean;
  postgres: { url: string; source: 'DATABASE_URL' | 'local'; reachable: boolean; error?: string };
  kafka: {
    source: 'KAFKA_BROKERS' | 'local';
    /** Each bootstrap broker, asked on its own. */
    brokers: Array<{ address: string; reachable: boolean }>;
    /** The nodes of the local cluster (stack up --brokers N) that run, each asked on its own. */
    cluster?: Array<{ address: string; reachable: boolean; pid: number | null }>;
    /** The local broker's process while it runs; null for KAFKA_BROKERS or a stopped broker. */
    pid: number | null;
    /** The local broker only: `starting` while its process runs but does not answer yet. */
    state?: 'up' | 'starting' | 'down';
    version?: string;
    log?: string;
  };
}

export async function stackStatus(): Promise<StackStatus> {
  const dbUrl = process.env.DATABASE_URL ?? localDatabaseUrl;
  const pgError = await postgresAnswers(dbUrl);
  const postgres = {
    url: redactUrl(dbUrl),
    source: process.env.DATABASE_URL ? ('DATABASE_URL' as const) : ('local' as const),
    reachable: !pgError,
    ...(pgError ? { error: pgError } : {}),
  };
  const probe = (list: string) =>
    Promise.all(
      list
        .split(',')
        .filter(Boolean)
        .map(async (address) => ({ address, reachable: await kafkaAnswers(address) })),
    );
  if (process.env.KAFKA_BROKERS) {
    const brokers = await probe(process.env.KAFKA_BROKERS);
    return {
      ok: postgres.reachable && brokers.every((b) => b.reachable),
      postgres,
      kafka: { source: 'KAFKA_BROKERS', brokers, pid: null },
    };
  }
  const pid = readPid();
  const alive = pid !== undefined && isAlive(pid);
  // Something else answering on the port while our broker is not running is not the local stack.
  const brokers = alive ? await probe(localBrokers) : [{ address: localBrokers, reachable: false }];
  const up = alive && brokers.every((b) => b.reachable);
  // The local cluster (stack up --brokers N), beside or instead of the single broker: each node that runs.
  const running = clusterNodes(9).filter((n) => nodePid(n) !== undefined);
  const cluster = await Promise.all(
    running.map(async (n) => ({
      address: n.address,
      reachable: await kafkaAnswers(n.address),
      pid: nodePid(n) ?? null,
    })),
  );
  const clusterUp = cluster.length > 0 && cluster.every((n) => n.reachable);
  return {
    ok: postgres.reachable && (cluster.length > 0 ? clusterUp && (up || !alive) : up),
    postgres,
    kafka: {
      source: 'local',
      brokers,
      pid: alive ? pid : null,
      state: up ? 'up' : alive ? 'starting' : 'down',
      version: KAFKA_VERSION,
      log: kafkaPaths.log,
      ...(cluster.length > 0 ? { cluster } : {}),
    },
  };
}

/** The status as the lines `npm run stack:status` has always printed. */
export function printStackStatus(s: StackStatus): void {
  const pg = s.postgres;
  log(`postgres ${pg.url}: ${pg.reachable ? 'up' : `DOWN (${pg.error})`}`);
  const k = s.kafka;
  if (k.source === 'KAFKA_BROKERS') {
    for (const b of k.brokers) log(`kafka ${b.address} (KAFKA_BROKERS): ${b.reachable ? 'up' : 'DOWN'}`);
    return;
  }
  const state = k.state === 'down' ? 'down' : `${k.state}, pid ${k.pid}`;
  if (k.state !== 'down' || !k.cluster)
    log(`kafka ${k.brokers[0]?.address} (local ${k.version}): ${state}; log ${k.log}`);
  for (const n of k.cluster ?? []) {
    log(
      `kafka ${n.address} (local cluster node, ${k.version}): ${n.reachable ? 'up' : 'DOWN'}, pid ${n.pid}`,
    );
  }
}
