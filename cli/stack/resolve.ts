/**
 * Finds a Postgres and a Kafka for tests, the demo and benchmarks, in this order:
 *  1. DATABASE_URL / KAFKA_BROKERS from the environment (each on its own);
 *  2. testcontainers, when a container engine answers (skipped with CAIRN_STACK=local);
 *  3. the local stack: Postgres at 127.0.0.1:5432 and a KRaft broker started from Maven jars.
 */
import { clusterBrokers, startLocalCluster } from './cluster.js';
import { kafkaAnswers, localBrokers, startLocalKafka } from './kafka.js';
import { localDatabaseUrl, postgresAnswers, postgresHelp } from './postgres.js';

export interface Stack {
  databaseUrl: string;
  kafkaBrokers: string;
  source: { postgres: string; kafka: string };
  /** Set when the stack is the local KRaft broker; `started` when this call started it. */
  localKafka?: { started: boolean };
  /** Stops what this call started in containers; the local broker stays up for the next run. */
  stop(): Promise<void>;
}

type Log = (line: string) => void;

export async function resolveStack(log: Log = (l) => console.error(`[cairn stack] ${l}`)): Promise<Stack> {
  const envDb = process.env.DATABASE_URL;
  const envKafka = process.env.KAFKA_BROKERS;
  const stops: Array<() => Promise<unknown>> = [];
  let databaseUrl = envDb;
  let kafkaBrokers = envKafka;
  const source = { postgres: envDb ? 'DATABASE_URL' : '', kafka: envKafka ? 'KAFKA_BROKERS' : '' };
  let localKafka: Stack['localKafka'];

  if ((!databaseUrl || !kafkaBrokers) && process.env.CAIRN_STACK !== 'local') {
    const engine = await containerEngine();
    if (engine.ok) {
      if (!databaseUrl) {
        const { PostgreSqlContainer } = await import('@testcontainers/postgresql');
        const pgc = await new PostgreSqlContainer('postgres:16-alpine').start();
        stops.push(() => pgc.stop());
        databaseUrl = pgc.getConnectionUri();
        source.postgres = 'testcontainers';
      }
      if (!kafkaBrokers) {
        const { KafkaContainer } = await import('@testcontainers/kafka');
        const kc = await new KafkaContainer('confluentinc/cp-kafka:7.7.1').withKraft().start();
        stops.push(() => kc.stop());
        kafkaBrokers = `${kc.getHost()}:${kc.getMappedPort(9093)}`;
        source.kafka = 'testcontainers';
      }
    } else {
      log(`no container engine answers (${engine.reason}); using the local stack instead`);
    }
  }

  if (!databaseUrl) {
    databaseUrl = localDatabaseUrl;
    source.postgres = 'local 127.0.0.1:5432';
  }
  const pgError = await postgresAnswers(databaseUrl);
  if (pgError) throw new Error(postgresHelp(databaseUrl, pgError, Boolean(envDb)));

  const clusterSize = Number(process.env.CAIRN_KAFKA_BROKERS_LOCAL ?? 1);
  if (!kafkaBrokers && clusterSize > 1) {
    localKafka = await startLocalCluster(clusterSize, log);
    kafkaBrokers = clusterBrokers(clusterSize);
    source.kafka = `local KRaft cluster of ${clusterSize} ${kafkaBrokers}`;
  } else if (!kafkaBrokers) {
    localKafka = await startLocalKafka(log);
    kafkaBrokers = localBrokers;
    source.kafka = `local KRaft broker ${localBrokers}`;
  } else if (!(await kafkaAnswers(kafkaBrokers, 5000))) {
    throw new Error(
      `Kafka did not answer at ${kafkaBrokers} (from ${source.kafka}) within 5 s. ` +
        (envKafka
          ? 'Check that the broker runs and advertises an address this machine can reach, or unset KAFKA_BROKERS to let Cairn start a local broker.'
          : 'The container started but does not answer; check the container engine.'),
    );
  }

  return {
    databaseUrl,
    kafkaBrokers,
    source,
    ...(localKafka ? { localKafka } : {}),
    async stop() {
      for (const stop of stops.reverse()) await stop();
    },
  };
}

async function containerEngine(): Promise<{ ok: true } | { ok: false; reason: string }> {
  try {
    const { getContainerRuntimeClient } = await import('testcontainers');
    await getContainerRuntimeClient();
    return { ok: true };
  } catch (err) {
    return { ok: false, reason: ((err as Error).message || String(err)).split('\n')[0] ?? 'unknown' };
  }
}
