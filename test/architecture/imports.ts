import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import ts from 'typescript';

/** Every .ts file under `dir`. */
export function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return sourceFiles(path);
    return e.name.endsWith('.ts') ? [path] : [];
  });
}

/** Every module a file names: static and dynamic imports, `import type`, `export ... from`. */
export function specifiers(text: string): string[] {
  return ts.preProcessFile(text, true, true).importedFiles.map((f) => f.fileName);
}
