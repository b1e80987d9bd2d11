import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';

const exec = promisify(execFile);
const guide = readFileSync(join(repoRoot, 'docs/getting-started.md'), 'utf8');

/** Each ```ts block of the guide: its first line names the app file it is (`// src/x.ts`). */
const snippets = [...guide.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => {
  const body = m[1]!;
  const file = /^\/\/ (src\/[\w/.-]+\.ts)\n/.exec(body)?.[1];
  return { file, body };
});

// Inside the checkout, so the app resolves kysely and @types/node from its node_modules.
const dir = mkdtempSync(join(repoRoot, '.doc-snippets-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('docs/getting-started.md', () => {
  it('names the file of every TypeScript block and imports Cairn by package name only', () => {
    expect(snippets.length).toBeGreaterThanOrEqual(6);
    for (const s of snippets) {
      expect(s.file, s.body.slice(0, 80)).toBeDefined();
      for (const [, from] of s.body.matchAll(/from '([^']+)'/g)) {
        expect(from).toMatch(
          /^(@cairn-state\/cairn(\/relay|\/inbox)?|kysely|node:[a-z_/]+|\.\/[\w/-]+\.js)$/,
        );
      }
    }
  });

  it('compiles, every block, against the real exports with tsc --strict', async () => {
    for (const s of snippets) {
      mkdirSync(dirname(join(dir, s.file!)), { recursive: true });
      writeFileSync(join(dir, s.file!), s.body);
    }
    // The package name maps to the entry points' sources, as package.json's exports map
    // maps it to their compiled declarations.
    const up = relative(dir, repoRoot) || '.';
    writeFileSync(
      join(dir, 'tsconfig.json'),
      JSON.stringify({
        extends: `${up}/tsconfig.json`,
        compilerOptions: {
          noEmit: true,
          strict: true,
          rootDir: up,
          paths: {
            '@cairn-state/cairn': [`${up}/src/index.ts`],
            '@cairn-state/cairn/relay': [`${up}/relay/index.ts`],
            '@cairn-state/cairn/inbox': [`${up}/consumers/index.ts`],
          },
        },
        include: ['src/**/*.ts'],
      }),
    );
    const r = await exec('npx', ['tsc', '-p', join(dir, 'tsconfig.json')], { cwd: repoRoot }).then(
      () => ({ code: 0, out: '' }),
      (e: { code: number; stdout: string }) => ({ code: e.code, out: e.stdout }),
    );
    expect(r.out).toBe('');
    expect(r.code).toBe(0);
  });
});
