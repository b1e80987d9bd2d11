import { execFile } from 'node:child_process';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { repoRoot } from '../../cli/stack/paths.js';

const run = promisify(execFile);

export interface Tarball {
  /** The .tgz, in a temporary folder outside the checkout. */
  path: string;
  /** Every path the tarball holds, relative to the package root. */
  files: string[];
  size: number;
  unpackedSize: number;
}

/** `npm pack` of the checkout (its `prepare` builds dist/ first), as a user's install would get it. */
export async function packTarball(): Promise<Tarball> {
  const dir = await mkdtemp(join(tmpdir(), 'cairn-pack-'));
  const { stdout } = await run('npm', ['pack', '--json', '--pack-destination', dir], {
    cwd: repoRoot,
    maxBuffer: 16 * 1024 * 1024,
  });
  // npm prints the build's output before the JSON when `prepare` runs.
  const [info] = JSON.parse(stdout.slice(stdout.indexOf('\n[') + 1)) as Array<{
    filename: string;
    files: Array<{ path: string }>;
    size: number;
    unpackedSize: number;
  }>;
  if (!info) throw new Error(`npm pack printed no JSON: ${stdout.slice(0, 500)}`);
  return {
    path: join(dir, info.filename),
    files: info.files.map((f) => f.path),
    size: info.size,
    unpackedSize: info.unpackedSize,
  };
}
