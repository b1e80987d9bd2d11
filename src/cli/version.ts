import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * `cairn --version`: the name and version of the package this file belongs to. Found by
 * walking up from this file, so it holds for src/cli (tsx in a checkout) and for
 * dist/src/cli (an installed package) alike.
 */
export function packageVersion(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const file = join(dir, 'package.json');
    if (existsSync(file)) {
      const pkg = JSON.parse(readFileSync(file, 'utf8')) as { name?: string; version?: string };
      if (pkg.name && pkg.version) return `${pkg.name} ${pkg.version}`;
    }
    const up = dirname(dir);
    if (up === dir) return 'cairn (version unknown: no package.json above the CLI)';
    dir = up;
  }
}
