import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import {
  CairnError,
  CairnErrorCodes,
  LeaseHeldError,
  StaleWriteError,
  ValidationError,
} from '../../src/index.js';

/** The library's own sources: what an application gets from the package's entry points. */
const LIBRARY_DIRS = ['src', 'relay', 'consumers'];

function sources(dir: string): string[] {
  return readdirSync(join(repoRoot, dir), { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile() && e.name.endsWith('.ts') && !e.name.endsWith('.test.ts'))
    .map((e) => join(e.parentPath, e.name));
}

/** `file:line: text` of each line of the library's sources that matches `pattern`. */
function linesMatching(pattern: RegExp): string[] {
  return LIBRARY_DIRS.flatMap(sources).flatMap((file) =>
    readFileSync(file, 'utf8')
      .split('\n')
      .flatMap((text, i) =>
        pattern.test(text) ? [`${relative(repoRoot, file)}:${i + 1}: ${text.trim()}`] : [],
      ),
  );
}

describe('errors the library throws', () => {
  it('are CairnErrors with a code: no bare `throw new Error(` in src/, relay/ or consumers/', () => {
    expect(linesMatching(/\bnew Error\(/)).toEqual([]);
  });

  it('have no Error subclass of their own beside CairnError', () => {
    expect(linesMatching(/\bextends Error\b/).map((l) => l.split(':')[0])).toEqual(['src/errors.ts']);
  });

  it('CairnErrorCodes has one distinct snake_case code per constant, and the subclasses use them', () => {
    const codes = Object.values(CairnErrorCodes);
    expect(new Set(codes).size).toBe(codes.length);
    for (const code of codes) expect(code).toMatch(/^[a-z]+(_[a-z]+)*$/);
    expect(new StaleWriteError('T-1', 1, 2).code).toBe(CairnErrorCodes.StaleVersion);
    expect(new ValidationError('x', []).code).toBe(CairnErrorCodes.ValidationFailed);
    const held = new LeaseHeldError('agent-a', new Date(0), 'lease T-1/main');
    expect({ code: held.code, retriable: held.retriable, isCairn: held instanceof CairnError }).toEqual({
      code: CairnErrorCodes.LeaseHeld,
      retriable: true,
      isCairn: true,
    });
  });
});
