/**
 * Any role can take any advisory lock: a tenant's session holding kysely's migration lock, or
 * cairn_register_tenant's, made `cairn migrate` (for up to an hour) and `cairn tenant add` wait
 * without a word. They now say who holds the lock (backend, role, state, since) while they wait,
 * and go on once it is let go.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { writeKeyring } from '../../src/crypto/keyProvider.js';
import type { Db } from '../../src/db/database.js';
import { forTenant, registerTenant } from '../../src/db/tenant.js';
import { cairnBundle } from '../support/cli.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

let t: TestDatabase;
let tenant: Db;
let role: string;
let keyring: string;
beforeAll(async () => {
  t = await createTestDatabase('cli_lock_wait');
  role = await registerTenant(t.db, 'lock-holder');
  tenant = forTenant(t.db, 'lock-holder', { max: 1 });
  keyring = join(mkdtempSync(join(tmpdir(), 'cairn-lockwait-')), 'keyring.json');
  writeKeyring(keyring);
});
afterAll(async () => {
  await tenant?.destroy();
  await t?.drop();
});

/** Runs the CLI in the background: its output so far, and its exit. */
function cairn(args: string[]) {
  const child = spawn(process.execPath, [cairnBundle(), ...args], {
    cwd: repoRoot,
    env: { ...process.env, DATABASE_URL: t.url, CAIRN_KEYRING: keyring },
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (b) => (out += b));
  child.stderr.on('data', (b) => (err += b));
  const exit = new Promise<number>((r) => child.on('exit', (code) => r(code ?? -1)));
  return { out: () => out, err: () => err, exit };
}

describe('a tenant holding the lock a command waits on', () => {
  it.each([
    [
      'cairn migrate',
      ['migrate'],
      'migration',
      sql`SELECT pg_advisory_lock(3853314791062309107)`,
      /up to date/,
    ],
    [
      'cairn tenant add',
      ['tenant', 'add', 'newcomer'],
      'tenant registration',
      sql`SELECT pg_advisory_lock(hashtext('cairn_register_tenant'))`,
      /newcomer: registered/,
    ],
  ])(
    '%s says who holds it while it waits, and goes on once it is let go',
    async (_name, args, lock, take, done) => {
      await tenant.connection().execute(async (session) => {
        await take.execute(session);
        const pid = (await sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`.execute(session)).rows[0]!
          .pid;
        const run = cairn(args);
        await waitFor(`the command to name the ${lock} lock's holder`, async () =>
          run.err().includes(`waiting for the ${lock} lock, held by backend ${pid} (role ${role}`),
        );
        expect(run.out()).toBe('');
        await sql`SELECT pg_advisory_unlock_all()`.execute(session);
        expect(await run.exit).toBe(0);
        expect(run.out()).toMatch(done);
      });
    },
  );

  it('with --json says nothing while it waits (stderr is one JSON object at most) and prints its result once let go', async () => {
    await tenant.connection().execute(async (session) => {
      await sql`SELECT pg_advisory_lock(3853314791062309107)`.execute(session);
      const run = cairn(['migrate', '--json']);
      await new Promise((r) => setTimeout(r, 4500)); // past the first look (3 s)
      expect(run.err()).toBe('');
      await sql`SELECT pg_advisory_unlock_all()`.execute(session);
      expect(await run.exit).toBe(0);
      expect(JSON.parse(run.out())).toMatchObject({ ran: [] });
      expect(run.err()).toBe('');
    });
  });
});
