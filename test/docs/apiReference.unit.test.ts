import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';

const run = promisify(execFile);
const config = JSON.parse(readFileSync(join(repoRoot, 'typedoc.json'), 'utf8')) as {
  entryPoints: string[];
  treatWarningsAsErrors: boolean;
  validation: Record<string, boolean>;
};
const pkg = JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as {
  exports: Record<string, { default: string } | string>;
};

describe('the API reference (TypeDoc)', () => {
  it('covers every entry point of the exports map and fails on a warning', () => {
    const sources = Object.values(pkg.exports)
      .filter((t): t is { default: string } => typeof t === 'object')
      .map((t) => t.default.replace(/^\.\/dist\//, '').replace(/\.js$/, '.ts'));
    expect([...config.entryPoints].sort()).toEqual(sources.sort());
    expect(config.treatWarningsAsErrors).toBe(true);
    expect(config.validation).toMatchObject({ notDocumented: true, notExported: true, invalidLink: true });
  });

  it('builds with no undocumented export, no dangling link and no referenced type left unexported', async () => {
    // --emit none: only conversion and validation, nothing is written.
    const result = await run(join(repoRoot, 'node_modules/.bin/typedoc'), ['--emit', 'none'], {
      cwd: repoRoot,
      env: { ...process.env, NO_COLOR: '1', FORCE_COLOR: '0' },
    }).then(
      (r) => ({ code: 0, output: r.stdout + r.stderr }),
      (e: { code: number; stdout: string; stderr: string }) => ({
        code: e.code,
        output: e.stdout + e.stderr,
      }),
    );
    const warnings = result.output.split('\n').filter((l) => /\[(warning|error)\]/.test(l));
    expect({ code: result.code, warnings }).toEqual({ code: 0, warnings: [] });
  }, 180_000);
});
