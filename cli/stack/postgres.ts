import pg from 'pg';

export const localDatabaseUrl = 'postgres://postgres@127.0.0.1:5432/test';

/** Connects once and runs `select 1`; returns the error message instead of throwing. */
export async function postgresAnswers(url: string, timeoutMs = 3000): Promise<string | undefined> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: timeoutMs });
  try {
    await client.connect();
    await client.query('select 1');
    return undefined;
  } catch (err) {
    return (err as Error).message || String(err);
  } finally {
    await client.end().catch(() => {});
  }
}

import { redact as redactUrl } from '../../src/db/database.js';

export { redactUrl };

export function postgresHelp(url: string, reason: string, fromEnv: boolean): string {
  return [
    `Postgres did not answer at ${redactUrl(url)}: ${reason}.`,
    fromEnv
      ? 'DATABASE_URL is set: check that the server runs and accepts this user, or unset DATABASE_URL to use 127.0.0.1:5432.'
      : 'Start a PostgreSQL 15+ server on 127.0.0.1:5432 (user postgres, database test, trust auth), ' +
        'e.g. on Debian: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start; or set DATABASE_URL=postgres://user:pass@host:port/db.',
  ].join('\n');
}
