import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { assertMayStopTheSharedBroker } from '../../cli/stack/brokerGuard.js';
import { repoRoot } from '../../cli/stack/paths.js';
import { STOP_THE_BROKER, stopsTheBroker } from './brokerFaults.js';

const testFiles = (dir: string): string[] =>
  readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory()
      ? testFiles(join(dir, e.name))
      : e.name.endsWith('.test.ts')
        ? [relative(repoRoot, join(dir, e.name))]
        : [],
  );

describe('test files that stop the shared broker', () => {
  const files = testFiles(join(repoRoot, 'test'));
  const self = relative(repoRoot, fileURLToPath(import.meta.url));
  const stopping = files.filter((f) => f !== self && stopsTheBroker(readFileSync(join(repoRoot, f), 'utf8')));

  it('are every one listed to run alone, last (a file beside them loses its broker)', () => {
    // The cluster tests start brokers of their own.
    expect(stopping.filter((f) => !f.endsWith('.cluster.test.ts')).sort()).toEqual(
      [...STOP_THE_BROKER].sort(),
    );
  });

  it('are crash tests, and each listed file exists', () => {
    for (const f of STOP_THE_BROKER) {
      expect(files, f).toContain(f);
      expect(f).toMatch(/\.chaos\.test\.ts$/);
    }
  });

  it('are recognised by what their source does', () => {
    expect(stopsTheBroker('await stopLocalKafka();')).toBe(true);
    expect(stopsTheBroker("signalLocalKafka('SIGSTOP');")).toBe(true);
    expect(stopsTheBroker("const pid = readPid()!;\nprocess.kill(pid, 'SIGSTOP');")).toBe(true);
    expect(stopsTheBroker("canRestartBroker: inject('kafkaLocal'),")).toBe(true);
    expect(stopsTheBroker('pid: readPid(),')).toBe(false); // read, not signalled
    expect(stopsTheBroker("if (inject('kafkaLocal')) {}")).toBe(false);
  });
});

describe('stopping the shared broker at run time', () => {
  it('is refused under vitest outside the broker-faults project, a child script included, and named', () => {
    // This file runs in the unit project: the broker-faults flag is not set here.
    expect(process.env.VITEST).toBeTruthy();
    expect(() => assertMayStopTheSharedBroker('stopLocalKafka')).toThrow(
      /^stopLocalKafka: under vitest only the broker-faults project may stop, pause or restart the shared broker; list the test file in STOP_THE_BROKER/,
    );
    expect(() => assertMayStopTheSharedBroker('restartBroker', { VITEST: 'true' })).toThrow(
      /broker-faults project/,
    );
  });

  it('is refused in a child script a test runs (it inherits VITEST)', () => {
    const child = spawnSync(
      process.execPath,
      [
        '--import',
        'tsx',
        '--input-type=module',
        '-e',
        "import('./cli/stack/brokerGuard.ts').then((m) => m.assertMayStopTheSharedBroker('a child script'))",
      ],
      { cwd: repoRoot, encoding: 'utf8', timeout: 60_000 },
    );
    expect(child.status).not.toBe(0);
    expect(child.stderr).toMatch(/a child script: under vitest only the broker-faults project may/);
  });

  it('is allowed in the broker-faults project, and outside vitest (`npm run stack:down`, the demo)', () => {
    expect(() =>
      assertMayStopTheSharedBroker('stopLocalKafka', { VITEST: 'true', CAIRN_BROKER_FAULTS: '1' }),
    ).not.toThrow();
    expect(() => assertMayStopTheSharedBroker('stopLocalKafka', {})).not.toThrow();
  });
});
