import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { repoRoot } from '../../scripts/stack/paths.js';

export interface Child {
  proc: ChildProcess;
  name: string;
  exited: Promise<number | null>;
  output(): string;
}

/** Starts a TypeScript entry point as a real child process (node + tsx). */
export function spawnTs(name: string, entry: string, env: Record<string, string>): Child {
  const proc = spawn(process.execPath, ['--import', 'tsx', entry], {
    cwd: repoRoot,
    env: { ...process.env, CAIRN_LOG_LEVEL: 'warn', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  proc.stdout?.on('data', (d) => {
    out = (out + d).slice(-20_000);
  });
  proc.stderr?.on('data', (d) => {
    out = (out + d).slice(-20_000);
  });
  const exited = once(proc, 'exit').then(([code]) => code as number | null);
  return { proc, name, exited, output: () => out };
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
