import { readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { sourceFiles, specifiers } from './imports.js';

/**
 * Arrows point down: the applications (`relay/`, `consumers/`, `cli/`, `scripts/`) import the
 * library, never the other way round. A module under src/ may reach src/ and the migrations
 * it runs, and nothing else of this repository, not even through the package's own name.
 */
const allowed = ['src/', 'migrations/'];
const packageName = (JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { name: string })
  .name;

/** The imports of `file` (a path under the repository) that leave the library, as `file -> specifier`. */
function violations(file: string, text: string): string[] {
  return specifiers(text)
    .filter((spec) => {
      if (spec === packageName || spec.startsWith(`${packageName}/`)) return true;
      if (!spec.startsWith('.')) return false; // node: built-ins and dependencies
      const target = relative(repoRoot, resolve(dirname(file), spec));
      return !allowed.some((dir) => `${target}/`.startsWith(dir));
    })
    .map((spec) => `${relative(repoRoot, file)} -> ${spec}`);
}

describe('layering: the library imports none of the applications built on it', () => {
  const files = sourceFiles(join(repoRoot, 'src'));

  it('no module under src/ imports relay/, consumers/, cli/, scripts/ (or test/, bench/)', () => {
    // The scan must see the library, or it proves nothing.
    expect(files.length).toBeGreaterThan(50);
    expect(files.flatMap((f) => specifiers(readFileSync(f, 'utf8'))).length).toBeGreaterThan(200);
    expect(files.flatMap((f) => violations(f, readFileSync(f, 'utf8')))).toEqual([]);
  });

  it('the check catches each way such an import can be written', () => {
    const file = join(repoRoot, 'src', 'outbox', 'example.ts');
    const text = [
      "import { runRelayProcess } from '../../relay/main.js';",
      "import type { InboxMessage } from '../../consumers/index.js';",
      "export { stackCommand } from '../../cli/stack.js';",
      "const m = await import('../../scripts/lib/faults.js');",
      "import '../../test/support/processes.js';",
      `import { createRelay } from '${packageName}/relay';`,
      // Allowed: the library itself, its migrations, Node and dependencies.
      "import { sql } from 'kysely';",
      "import { readFileSync } from 'node:fs';",
      "import { CairnError } from '../errors.js';",
      "import { migrations } from '../../migrations/index.js';",
    ].join('\n');
    expect(violations(file, text)).toEqual([
      'src/outbox/example.ts -> ../../relay/main.js',
      'src/outbox/example.ts -> ../../consumers/index.js',
      'src/outbox/example.ts -> ../../cli/stack.js',
      'src/outbox/example.ts -> ../../scripts/lib/faults.js',
      'src/outbox/example.ts -> ../../test/support/processes.js',
      `src/outbox/example.ts -> ${packageName}/relay`,
    ]);
  });
});
