#!/usr/bin/env node
// Runs the compiled CLI (built by `npm run build`, which `npm ci` runs through `prepare`).
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const entry = new URL('../dist/cli/main.js', import.meta.url);
if (!existsSync(fileURLToPath(entry))) {
  console.error(
    'cairn: dist/ is missing; run `npm run build` first (or `npm run cairn -- <command>` from a checkout)',
  );
  process.exit(1);
}
await import(entry.href);
