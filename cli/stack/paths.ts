import { mkdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Repository root, whether this file runs from `cli/stack` or from `dist/cli/stack`. */
function findRoot(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  const up = resolve(here, '..', '..');
  return up.endsWith('dist') ? resolve(up, '..') : up;
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
