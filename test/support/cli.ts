import { bundle } from '../../scripts/lib/spawnTs.js';

/**
 * The `cairn` CLI bundled once per test process (as crash tests' children are): run it as
 * `execFile(process.execPath, [cairnBundle(), ...args], { cwd: repoRoot })`. Each start under
 * `npx tsx` cost ~3 s of CPU on 2 cores (npm, the tsx CLI and a child compiling TypeScript),
 * and the CLI suites start dozens.
 */
export function cairnBundle(): string {
  return bundle('cli/main.ts');
}
