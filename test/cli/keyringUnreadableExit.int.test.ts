// Review (a key provider that is not there now is an outage): `cairn checkpoint verify` whose
// keyring file cannot be read (a secrets volume not mounted yet, a file being replaced) has
// checked nothing, yet exits 1, the code of "a checkpoint is CORRUPT". The checkpointer itself
// calls keyring_unreadable an outage (OUTAGE_CODES); src/exitCodes.ts maps only `unavailable`
// to 75.
import { execFile } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { cairnBundle } from '../support/cli.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase } from '../support/testDatabase.js';

const exec = promisify(execFile);
let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase('cli_keyring_unreadable');
  await createTaskStore({ db: t.db }).create({ task: newTask('K-1'), actor: AGENT });
});
afterAll(async () => {
  await t?.drop();
});

it('checkpoint verify with an unreadable keyring exits 75 (nothing checked), not 1 (corrupt)', async () => {
  const missing = join(mkdtempSync(join(tmpdir(), 'cairn-review-')), 'not-mounted', 'keyring.json');
  const r = await exec(process.execPath, [cairnBundle(), 'checkpoint', 'verify', 'K-1'], {
    cwd: repoRoot,
    env: {
      ...process.env,
      DATABASE_URL: t.url,
      KAFKA_BROKERS: kafkaBrokers().join(','),
      CAIRN_KEYRING: missing,
    },
  }).then(
    () => ({ code: 0, err: '' }),
    (e: { code: number; stderr: string }) => ({ code: e.code, err: e.stderr }),
  );
  expect(r.err).toMatch(/keyring_unreadable/);
  expect(r.code).toBe(75);
});
