import { readdirSync, readFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { packTarball, type Tarball } from './packTarball.js';

interface ExportTarget {
  types: string;
  default: string;
}
const pkg = JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as {
  name: string;
  exports: Record<string, ExportTarget | string>;
  main: string;
  types: string;
  bin: Record<string, string>;
};
const entryPoints = Object.entries(pkg.exports).filter(
  (e): e is [string, ExportTarget] => typeof e[1] === 'object',
);

/** The source index.ts of a compiled entry point: dist/src/index.js -> src/index.ts. */
const sourceOf = (target: string) =>
  join(repoRoot, target.replace(/^\.\/dist\//, '').replace(/\.js$/, '.ts'));

/** Every name an entry point exports (values and types), as the compiler sees it. */
function exportedNames(): Map<string, string[]> {
  const roots = entryPoints.map(([, t]) => sourceOf(t.default));
  const config = ts.getParsedCommandLineOfConfigFile(
    join(repoRoot, 'tsconfig.json'),
    {},
    {
      ...ts.sys,
      onUnRecoverableConfigFileDiagnostic: (d) => {
        throw new Error(ts.flattenDiagnosticMessageText(d.messageText, '\n'));
      },
    },
  );
  const program = ts.createProgram(roots, { ...config!.options, noEmit: true });
  const checker = program.getTypeChecker();
  const names = new Map<string, string[]>();
  for (const [entry, target] of entryPoints) {
    const file = program.getSourceFile(sourceOf(target.default));
    const symbol = file && checker.getSymbolAtLocation(file);
    if (!symbol) throw new Error(`no module for ${entry}`);
    names.set(
      entry,
      checker.getExportsOfModule(symbol).map((s) => s.getName()),
    );
  }
  return names;
}

let tarball: Tarball;
beforeAll(async () => {
  tarball = await packTarball();
}, 180_000);
afterAll(async () => {
  if (tarball) await rm(dirname(tarball.path), { recursive: true, force: true });
});

describe(`the ${pkg.name} tarball`, () => {
  it('holds no tests, benchmarks, CI or demo harnesses, and no TypeScript sources', () => {
    const bad = tarball.files.filter(
      (f) =>
        /^(dist\/)?(test|bench|\.ci)\//.test(f) ||
        /^(dist\/)?scripts\//.test(f) ||
        (f.endsWith('.ts') && !f.endsWith('.d.ts')) ||
        f.endsWith('.map'),
    );
    expect(bad).toEqual([]);
  });

  it('holds the JavaScript and declarations of each entry point, main/types, the bin, README, LICENSE and CHANGELOG', () => {
    const files = new Set(tarball.files);
    const wanted = [
      'package.json',
      'README.md',
      'LICENSE',
      'CHANGELOG.md',
      ...Object.values(pkg.bin).map((b) => b.replace(/^\.\//, '')),
      'dist/cli/main.js', // what bin/cairn.mjs loads
      pkg.main.replace(/^\.\//, ''),
      pkg.types.replace(/^\.\//, ''),
      ...entryPoints.flatMap(([, t]) => [t.types, t.default].map((p) => p.replace(/^\.\//, ''))),
    ];
    expect(wanted.filter((f) => !files.has(f))).toEqual([]);
    // Every compiled module ships its declarations beside it.
    const js = tarball.files.filter((f) => f.startsWith('dist/') && f.endsWith('.js'));
    expect(js.filter((f) => !files.has(f.replace(/\.js$/, '.d.ts')))).toEqual([]);
    console.log(
      `${tarball.files.length} files, ${(tarball.size / 1024).toFixed(1)} kB packed, ${(tarball.unpackedSize / 1024).toFixed(1)} kB unpacked`,
    );
  });

  it('every name exported by an entry point is documented in the README or docs/', () => {
    const docs = [
      readFileSync(join(repoRoot, 'README.md'), 'utf8'),
      ...readdirSync(join(repoRoot, 'docs'))
        .filter((f) => f.endsWith('.md'))
        .map((f) => readFileSync(join(repoRoot, 'docs', f), 'utf8')),
    ].join('\n');
    const names = exportedNames();
    expect([...names.keys()].sort()).toEqual(['.', './console', './inbox', './langgraph', './relay']);
    const undocumented = [...names].flatMap(([entry, list]) =>
      list.filter((n) => !new RegExp(`\\b${n}\\b`).test(docs)).map((n) => `${entry}: ${n}`),
    );
    expect(undocumented).toEqual([]);
    // The library's surface is what src/index.ts names, not every module under src/.
    expect(names.get('.')).toContain('createDb');
    expect(names.get('.')).not.toContain('createPool');
    expect(names.get('./relay')).toContain('createRelay');
    expect(names.get('./inbox')).toContain('createInboxConsumer');
    expect(names.get('./langgraph')).toContain('CairnSaver');
    expect(names.get('./console')).toContain('startConsole');
  });
});
