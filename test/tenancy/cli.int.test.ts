import { execFile } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { cairnBundle } from '../support/cli.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const exec = promisify(execFile);
let t: TestDatabase;
let keyring: string;

async function cairn(...args: string[]): Promise<{ code: number; out: string; err: string }> {
  try {
    const r = await exec(process.execPath, [cairnBundle(), ...args], {
      cwd: repoRoot,
      env: { ...process.env, DATABASE_URL: t.url, CAIRN_KEYRING: keyring },
    });
    return { code: 0, out: r.stdout, err: r.stderr };
  } catch (e) {
    const x = e as { code: number; stdout: string; stderr: string };
    return { code: x.code, out: x.stdout, err: x.stderr };
  }
}

beforeAll(async () => {
  t = await createTestDatabase('tenancy_cli');
  keyring = join(mkdtempSync(join(tmpdir(), 'cairn-cli-')), 'keyring.json');
});
afterAll(async () => {
  await t?.drop();
});

describe('cairn keys | tenant | retention | hold (the CLI)', () => {
  it('sets up a tenant, a policy and a hold; refuses bad input by name with exit 1', async () => {
    expect((await cairn('keys', 'init', '--file', keyring)).out).toMatch(/current key-encryption key kek-/);
    expect((await cairn('tenant', 'add', 'cli-a')).out).toMatch(/cli-a: registered, data key dk-/);
    expect(
      (await cairn('retention', 'policy', '--tenant', 'cli-a', '--class', 'internal', '--days', '7')).code,
    ).toBe(0);
    const run = await cairn('retention', 'run', '--dry-run', '--json');
    expect(JSON.parse(run.out)).toMatchObject({ dryRun: true, tasks: [], certificates: [] });
    const bad = await cairn('hold', 'place', '--tenant', 'cli-a');
    expect(bad.code).toBe(1);
    expect(bad.err).toMatch(/reason: is required and must not be empty/);
    expect((await cairn('hold', 'place', '--tenant', 'cli-a', '--reason', 'audit')).out).toMatch(
      /on tenant cli-a: audit/,
    );
    const unknown = await cairn('retention', 'run', '--tenant', 'nobody');
    expect(unknown.code).toBe(1);
    expect(unknown.err).toMatch(/\[unknown_tenant\] unknown tenant nobody/);
  });
});
