/**
 * `npm run stack:up | stack:down | stack:status`: the local Postgres + Kafka that tests, the
 * demo and the benchmarks use when DATABASE_URL / KAFKA_BROKERS are not set.
 */
import {
  isAlive,
  KAFKA_VERSION,
  kafkaAnswers,
  localBrokers,
  readPid,
  stopLocalKafka,
} from './stack/kafka.js';
import { kafkaPaths } from './stack/paths.js';
import { localDatabaseUrl, postgresAnswers, redactUrl } from './stack/postgres.js';
import { resolveStack } from './stack/resolve.js';

const log = (line: string) => console.log(`[cairn stack] ${line}`);

async function up(): Promise<void> {
  process.env.CAIRN_STACK = 'local';
  const stack = await resolveStack(log);
  log(`postgres: ${redactUrl(stack.databaseUrl)} (${stack.source.postgres})`);
  log(`kafka:    ${stack.kafkaBrokers} (${stack.source.kafka})`);
  console.log(`export DATABASE_URL=${stack.databaseUrl}`);
  console.log(`export KAFKA_BROKERS=${stack.kafkaBrokers}`);
}

async function down(): Promise<void> {
  const stopped = await stopLocalKafka();
  log(stopped ? 'Kafka broker stopped' : 'no local Kafka broker was running');
}

async function status(): Promise<number> {
  const dbUrl = process.env.DATABASE_URL ?? localDatabaseUrl;
  const pgError = await postgresAnswers(dbUrl);
  log(`postgres ${redactUrl(dbUrl)}: ${pgError ? `DOWN (${pgError})` : 'up'}`);
  if (process.env.KAFKA_BROKERS) {
    const ok = await kafkaAnswers(process.env.KAFKA_BROKERS);
    log(`kafka ${process.env.KAFKA_BROKERS} (KAFKA_BROKERS): ${ok ? 'up' : 'DOWN'}`);
    return pgError || !ok ? 1 : 0;
  }
  const pid = readPid();
  const alive = pid !== undefined && isAlive(pid);
  const ok = alive && (await kafkaAnswers(localBrokers));
  log(
    `kafka ${localBrokers} (local ${KAFKA_VERSION}): ${ok ? `up, pid ${pid}` : alive ? `starting, pid ${pid}` : 'down'}; log ${kafkaPaths.log}`,
  );
  return pgError || !ok ? 1 : 0;
}

const command = process.argv[2];
try {
  if (command === 'up') await up();
  else if (command === 'down') await down();
  else if (command === 'status') process.exitCode = await status();
  else {
    console.error('usage: tsx scripts/stack.ts up|down|status');
    process.exitCode = 2;
  }
} catch (err) {
  console.error(`[cairn stack] ${(err as Error).message}`);
  process.exitCode = 1;
}
