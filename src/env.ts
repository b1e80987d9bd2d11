/** Where Cairn's commands find Postgres and Kafka when no option names them. */
export const defaultDatabaseUrl = 'postgres://postgres@127.0.0.1:5432/test';
export const defaultKafkaBrokers = '127.0.0.1:19092';

export function databaseUrlFromEnv(): string {
  return process.env.DATABASE_URL ?? defaultDatabaseUrl;
}

export function kafkaBrokersFromEnv(): string[] {
  return (process.env.KAFKA_BROKERS ?? defaultKafkaBrokers)
    .split(',')
    .map((b) => b.trim())
    .filter(Boolean);
}
