import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The name and version of the package this file belongs to. Found by walking up from this
 * file, so it holds for cli/ (tsx in a checkout) and for dist/cli/ (an installed
 * package) alike.
 */
export function packageInfo(): { name: string; version: string } | undefined {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const file = join(dir, 'package.json');
    if (existsSync(file)) {
      const pkg = JSON.parse(readFileSync(file, 'utf8')) as { name?: string; version?: string };
      if (pkg.name && pkg.version) return { name: pkg.name, version: pkg.version };
    }
    const up = dirname(dir);
    if (up === dir) return undefined;
    dir = up;
  }
}

/** `cairn --version`. */
export function packageVersion(): string {
  const p = packageInfo();
  return p ? `${p.name} ${p.version}` : 'cairn (version unknown: no package.json above the CLI)';
}
