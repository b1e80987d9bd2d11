// Review (outage is not a finding): a CLI command whose Postgres session is terminated mid-way
// (57P01, a restart or failover of the server) concluded nothing. It must exit 75
// (unavailable: run it again), never 1, which for `failover check` means "something was lost"
// and for `checkpoint verify` "a checkpoint is corrupt".
import { spawn } from 'node:child_process';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { cairnBundle } from '../support/cli.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';

let t: TestDatabase;
let topic: string;

beforeAll(async () => {
  t = await createTestDatabase('cli_outage_exit');
  topic = await createTestTopic('cli-outage-exit', 1);
  await createTaskStore({ db: t.db }).create({ task: newTask('T-exit'), actor: AGENT });
});
afterAll(async () => {
  await t?.drop();
});

/**
 * Runs `cairn <args>` while `table` is locked: once the CLI's query waits for the lock, its
 * backend is terminated (what a server restart does to every session), then the lock goes.
 */
async function cairnWithTerminatedSession(args: string[], table: string) {
  // pg_stat_activity is read from another session: within a transaction it is a snapshot.
  const lock = await t.db.connection().execute(async (conn) => {
    await sql`BEGIN`.execute(conn);
    await sql`LOCK TABLE ${sql.table(table)} IN ACCESS EXCLUSIVE MODE`.execute(conn);
    const child = spawn(process.execPath, [cairnBundle(), ...args], {
      cwd: repoRoot,
      env: { ...process.env, DATABASE_URL: t.url, KAFKA_BROKERS: kafkaBrokers().join(',') },
    });
    let err = '';
    child.stderr.on('data', (d) => {
      err += String(d);
    });
    const exited = new Promise<number>((r) => child.on('exit', (code) => r(code ?? -1)));
    const deadline = Date.now() + 60_000;
    let terminated = 0;
    let done = false;
    void exited.then(() => {
      done = true;
    });
    while (terminated === 0 && !done && Date.now() < deadline) {
      const r = await sql<{ n: number }>`
        SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
         WHERE datname = ${t.name} AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'`.execute(t.db);
      terminated = r.rows[0]!.n;
      if (terminated === 0) await new Promise((x) => setTimeout(x, 50));
    }
    await sql`ROLLBACK`.execute(conn);
    return { code: await exited, err, terminated };
  });
  return lock;
}

it('failover check: a terminated Postgres session exits 75 (unavailable), not 1 (something lost)', async () => {
  const r = await cairnWithTerminatedSession(
    ['failover', 'check', '--topics', topic, '--group', `g-exit=${topic}`],
    'inbox',
  );
  expect(r.terminated, r.err).toBe(1);
  expect(r.err).toMatch(/terminat/i);
  expect(r.code).toBe(75);
});

it('checkpoint verify: a terminated Postgres session exits 75 (unavailable), not 1 (corrupt)', async () => {
  const r = await cairnWithTerminatedSession(['checkpoint', 'verify', 'T-exit'], 'checkpoint');
  expect(r.terminated, r.err).toBe(1);
  expect(r.err).toMatch(/terminat/i);
  expect(r.code).toBe(75);
});
