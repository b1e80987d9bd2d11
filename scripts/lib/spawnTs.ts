import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { appendFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { buildSync } from 'esbuild';
import { repoRoot, stackDir } from '../../cli/stack/paths.js';

export interface Child {
  proc: ChildProcess;
  name: string;
  exited: Promise<number | null>;
  output(): string;
}

const bundles = new Map<string, string>();

// Children never outlive the process that started them, even when a test fails halfway or
// times out and its worker is ended with a signal (no 'exit' event then: seen, demo agents of
// a timed-out soak test were still running after vitest had finished).
const live = new Set<ChildProcess>();
const killAll = () => {
  for (const p of live) p.kill('SIGKILL');
};
process.once('exit', killAll);
for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) {
  process.once(sig, () => {
    killAll();
    // Nobody else listens: do what the signal would have done.
    if (process.listenerCount(sig) === 0) process.kill(process.pid, sig);
  });
}

/**
 * Bundles a TypeScript entry point once per process (esbuild, dependencies left external) so
 * that each child starts as plain node: crash tests and the demo start many processes, and
 * compiling TypeScript in every one of them (tsx) costs about a second each on 2 cores.
 */
export function bundle(entry: string): string {
  let out = bundles.get(entry);
  if (!out) {
    out = join(stackDir, 'bundles', `${entry.replace(/[^a-zA-Z0-9]/g, '_')}.${process.pid}.mjs`);
    buildSync({
      entryPoints: [join(repoRoot, entry)],
      outfile: out,
      bundle: true,
      platform: 'node',
      format: 'esm',
      target: 'node20',
      packages: 'external',
      logLevel: 'error',
    });
    bundles.set(entry, out);
  }
  return out;
}

/**
 * Starts a TypeScript entry point (path relative to the repository; or `[path, ...argv]` to
 * pass it a command line) as a real child process. With CAIRN_CHILD_LOG_DIR set, each child's
 * whole output is also appended to `<dir>/<name>.log`: a failed chaos run otherwise keeps only
 * the last 20 kB of a process that exited by itself.
 */
export function spawnTs(
  name: string,
  entry: string | readonly [string, ...string[]],
  env: Record<string, string>,
): Child {
  const [path, ...argv] = typeof entry === 'string' ? [entry] : entry;
  let logFile: string | null = null;
  try {
    logFile = childLogFile(name);
  } catch (err) {
    // A copy for debugging must never fail the run it documents.
    process.stderr.write(`[spawnTs] not logging ${name}: ${(err as Error).message}\n`);
  }
  const proc = spawn(process.execPath, [bundle(path), ...argv], {
    cwd: repoRoot,
    env: { ...process.env, CAIRN_LOG_LEVEL: process.env.CAIRN_LOG_LEVEL ?? 'warn', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  const keep = (d: Buffer) => {
    out = (out + d).slice(-20_000);
    if (!logFile) return;
    try {
      appendFileSync(logFile, d);
    } catch (err) {
      process.stderr.write(`[spawnTs] not logging ${name} to ${logFile}: ${(err as Error).message}\n`);
      logFile = null;
    }
  };
  proc.stdout?.on('data', keep);
  proc.stderr?.on('data', keep);
  live.add(proc);
  const exited = once(proc, 'exit').then(([code]) => {
    live.delete(proc);
    return code as number | null;
  });
  return { proc, name, exited, output: () => out };
}

/**
 * `<CAIRN_CHILD_LOG_DIR>/<name>.log`, the folder created, or null without the variable. A name
 * that is a path (`test/support/effectConsumer.ts`) becomes one file name: under a missing
 * subfolder every write failed, and the test process with it.
 */
export function childLogFile(name: string): string | null {
  const dir = process.env.CAIRN_CHILD_LOG_DIR;
  if (!dir) return null;
  mkdirSync(dir, { recursive: true });
  return join(dir, `${name.replace(/[^\w.-]+/g, '_')}.log`);
}

export async function sigkill(child: Child): Promise<void> {
  if (child.proc.exitCode === null && child.proc.signalCode === null) child.proc.kill('SIGKILL');
  await child.exited;
}

export async function sigterm(child: Child, deadlineMs = 20_000): Promise<number | null> {
  if (child.proc.exitCode !== null || child.proc.signalCode !== null) return child.proc.exitCode;
  child.proc.kill('SIGTERM');
  const timer = setTimeout(() => child.proc.kill('SIGKILL'), deadlineMs);
  const code = await child.exited;
  clearTimeout(timer);
  return code;
}
