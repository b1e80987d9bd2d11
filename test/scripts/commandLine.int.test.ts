import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';

const exec = promisify(execFile);

/**
 * Nothing answers at these addresses: a script that went past its command line would fail
 * to connect (exit 1) instead of exiting 0 or 2, and it would not start a broker either.
 */
const unreachable = {
  DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none',
  KAFKA_BROKERS: '127.0.0.1:1',
  CAIRN_STACK: 'local',
};

async function run(cmd: string, args: string[]): Promise<{ code: number; out: string; err: string }> {
  try {
    const r = await exec(cmd, args, {
      cwd: repoRoot,
      env: { ...process.env, ...unreachable },
      timeout: 60_000,
    });
    return { code: 0, out: r.stdout, err: r.stderr };
  } catch (e) {
    const x = e as { code: number; stdout: string; stderr: string };
    return { code: x.code, out: x.stdout, err: x.stderr };
  }
}

const script = (name: string, ...args: string[]) =>
  run(process.execPath, ['--import', 'tsx', `scripts/${name}.ts`, ...args]);

describe.each([
  ['demo', ['--tasks', '0'], /--tasks: must be > 0 \(got "0"\)/],
  ['chaos', ['--minutes', 'ten'], /--minutes: must be a number \(got "ten"\)/],
  ['failover', ['--mode', 'semi'], /--mode: .*"sync"\|"async" \(got "semi"\)/],
])('npm run %s', (name, badValue, badValueMessage) => {
  it('--help prints the usage on stdout and exits 0 before connecting to anything', async () => {
    const r = await script(name, '--help');
    expect({ code: r.code, err: r.err }).toEqual({ code: 0, err: '' });
    expect(r.out).toContain(`usage: npm run ${name} -- [flags]`);
    expect(r.out).toMatch(/^ {2}--help {2,}this text$/m);
  });

  it('an unknown flag: one line naming it and the usage hint, exit 2, before connecting to anything', async () => {
    const r = await script(name, '--no-such-flag');
    expect({ code: r.code, out: r.out }).toEqual({ code: 2, out: '' });
    expect(r.err).toBe(
      `${name}: [usage] Unknown option '--no-such-flag' (usage: npm run ${name} -- --help)\n`,
    );
  });

  it('a bad value: one line naming the flag and the value, exit 2, before connecting to anything', async () => {
    const r = await script(name, ...badValue);
    expect({ code: r.code, out: r.out }).toEqual({ code: 2, out: '' });
    expect(r.err.trim().split('\n')).toHaveLength(1);
    expect(r.err).toMatch(badValueMessage);
    expect(r.err).toContain(`(usage: npm run ${name} -- --help)`);
  });
});

it('npm passes the flags through: `npm run demo -- --help` prints the usage, exit 0', async () => {
  const r = await run('npm', ['run', '-s', 'demo', '--', '--help']);
  expect(r.code).toBe(0);
  expect(r.out).toContain('usage: npm run demo -- [flags]');
});
