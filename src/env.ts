import { ConfigurationError } from './errors.js';

/** Where Cairn's commands find Postgres and Kafka when no option names them. */
export const defaultDatabaseUrl = 'postgres://postgres@127.0.0.1:5432/test';
export const defaultKafkaBrokers = '127.0.0.1:19092';

/** DATABASE_URL, checked to be a postgres:// URL; a malformed one is a ConfigurationError naming it. */
export function databaseUrlFromEnv(): string {
  const url = process.env.DATABASE_URL ?? defaultDatabaseUrl;
  let protocol: string | undefined;
  try {
    protocol = new URL(url).protocol;
  } catch {}
  if (protocol !== 'postgres:' && protocol !== 'postgresql:') {
    throw new ConfigurationError(
      `DATABASE_URL is not a postgres:// URL: "${maskPassword(url)}". ` +
        'Set it like DATABASE_URL=postgres://user:password@host:5432/database (percent-encode special characters in the password).',
    );
  }
  return url;
}

/** KAFKA_BROKERS as a list of host:port; a malformed entry is a ConfigurationError naming it. */
export function kafkaBrokersFromEnv(): string[] {
  const raw = process.env.KAFKA_BROKERS ?? defaultKafkaBrokers;
  const brokers = raw
    .split(',')
    .map((b) => b.trim())
    .filter(Boolean);
  const bad = brokers.filter((b) => {
    const m = /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$/.exec(b);
    return !m || Number(m[2]) < 1 || Number(m[2]) > 65535;
  });
  if (brokers.length === 0 || bad.length > 0) {
    throw new ConfigurationError(
      `KAFKA_BROKERS is not a comma-separated list of host:port: "${raw}"` +
        `${bad.length > 0 ? ` (cannot use ${bad.map((b) => `"${b}"`).join(', ')})` : ''}. ` +
        'Set it like KAFKA_BROKERS=kafka-1.example:9092,kafka-2.example:9092.',
    );
  }
  return brokers;
}

/** For a string that URL cannot parse: hides whatever sits between user: and the last @. */
function maskPassword(url: string): string {
  return url.replace(/^([a-z]+:\/\/[^:@/]*:)[^/]*@/i, '$1***@');
}
