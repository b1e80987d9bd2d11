import { existsSync, mkdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * Repository (or installed package) root: the nearest folder above this file with a
 * package.json, whether it runs from `cli/stack`, from `dist/cli/stack` or bundled into a
 * test's `.cairn/bundles/*.mjs`.
 */
function findRoot(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  for (let dir = here; ; dir = dirname(dir)) {
    if (existsSync(join(dir, 'package.json'))) return dir;
    if (dirname(dir) === dir) return resolve(here, '..', '..');
  }
}

export const repoRoot = findRoot();

/** Everything the local stack downloads or writes lives here; the folder is git-ignored. */
export const stackDir = process.env.CAIRN_STACK_DIR ?? join(repoRoot, '.cairn');

export const kafkaPaths = {
  root: join(stackDir, 'kafka'),
  libs: join(stackDir, 'kafka', 'libs'),
  data: join(stackDir, 'kafka', 'data'),
  log: join(stackDir, 'kafka', 'broker.log'),
  pid: join(stackDir, 'kafka', 'broker.pid'),
  config: join(stackDir, 'kafka', 'server.properties'),
  log4j: join(stackDir, 'kafka', 'log4j.properties'),
  clusterId: join(stackDir, 'kafka', 'cluster-id'),
  pom: join(repoRoot, 'cli', 'stack', 'kafka', 'pom.xml'),
};

export function ensureDir(path: string): string {
  mkdirSync(path, { recursive: true });
  return path;
}
