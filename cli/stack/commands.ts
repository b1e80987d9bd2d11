/** `up`, `down` and `status` of the local stack, shared by `npm run stack:*` and `cairn stack`. */
import { isAlive, KAFKA_VERSION, kafkaAnswers, localBrokers, readPid, stopLocalKafka } from './kafka.js';
import { kafkaPaths } from './paths.js';
import { localDatabaseUrl, postgresAnswers, redactUrl } from './postgres.js';
import { resolveStack } from './resolve.js';

const log = (line: string) => console.log(`[cairn stack] ${line}`);

export async function up(): Promise<void> {
  process.env.CAIRN_STACK = 'local';
  const stack = await resolveStack(log);
  log(`postgres: ${redactUrl(stack.databaseUrl)} (${stack.source.postgres})`);
  log(`kafka:    ${stack.kafkaBrokers} (${stack.source.kafka})`);
  console.log(`export DATABASE_URL=${stack.databaseUrl}`);
  console.log(`export KAFKA_BROKERS=${stack.kafkaBrokers}`);
}

export async function down(): Promise<void> {
  const stopped = await stopLocalKafka();
  log(stopped ? 'Kafka broker stopped' : 'no local Kafka broker was running');
}

export async function status(): Promise<number> {
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
