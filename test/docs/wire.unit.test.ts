import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { DLQ_HEADER, HEADER, wireHeaders } from '../../src/outbox/wire.js';

const doc = readFileSync(join(repoRoot, 'docs/wire.md'), 'utf8');
const source = readFileSync(join(repoRoot, 'src/outbox/wire.ts'), 'utf8');

interface Row {
  header: string;
  key: string;
  meaning: string;
  setBy: string;
  column: string;
}

/** The rows of the table under a `## title` whose second column is `prefix` (HEADER. or DLQ_HEADER.). */
function table(prefix: string): Row[] {
  const start = doc.indexOf(`| \`${prefix}\` |`);
  expect(start, `a table with a ${prefix} column in docs/wire.md`).toBeGreaterThan(0);
  const lines = doc.slice(start).split('\n');
  const rows: Row[] = [];
  for (const line of lines.slice(2)) {
    if (!line.startsWith('|')) break;
    const cells = line
      .split('|')
      .slice(1, -1)
      .map((c) => c.trim().replace(/^`|`$/g, ''));
    rows.push({ header: cells[0]!, key: cells[1]!, meaning: cells[2]!, setBy: cells[3]!, column: cells[4]! });
  }
  return rows;
}

/** What wire.ts's TSDoc says of each key of a constant: the sentence, and the column it names. */
function documented(constant: string): Map<string, { meaning: string; column?: string }> {
  const body = new RegExp(`export const ${constant} = \\{([\\s\\S]*?)\\} as const;`).exec(source)![1]!;
  const out = new Map<string, { meaning: string; column?: string }>();
  for (const [, comment, key] of body.matchAll(/\/\*\* ([\s\S]*?) \*\/\s*(\w+): '/g)) {
    const text = comment!.replace(/\s*\n\s*\*\s*/g, ' ');
    const column = /\((outbox\.\w+)\)/.exec(text)?.[1];
    const meaning = text
      .replace(/ \(outbox\.\w+\)/, '')
      .replace(/\.$/, '')
      .replace(/^./, (c) => c.toLowerCase());
    out.set(key!, { meaning, ...(column ? { column } : {}) });
  }
  return out;
}

describe('docs/wire.md', () => {
  it('lists exactly the headers of HEADER, with the meaning and the outbox column wire.ts gives each', () => {
    const rows = table('HEADER.');
    const said = documented('HEADER');
    expect(Object.fromEntries(rows.map((r) => [r.key, r.header]))).toEqual(HEADER);
    for (const r of rows) {
      expect({ key: r.key, meaning: r.meaning, column: r.column, setBy: r.setBy }).toEqual({
        key: r.key,
        meaning: said.get(r.key)!.meaning,
        column: said.get(r.key)!.column,
        setBy: 'relay',
      });
    }
  });

  it('says the column the relay really builds each header from', () => {
    const row = {
      message_id: 'value-of-message_id',
      tenant_id: 'value-of-tenant_id',
      task_id: 'value-of-task_id',
      task_version: 7,
      task_seq: 2,
    };
    // A caller's forged cairn-* header is dropped; Cairn's come from the columns.
    const headers = wireHeaders({ 'cairn-tenant': 'forged', mine: 'kept' }, row);
    expect(headers.mine).toBe('kept');
    for (const r of table('HEADER.')) {
      const column = r.column.replace(/^outbox\./, '') as keyof typeof row;
      expect({ header: r.header, value: headers[r.header] }).toEqual({
        header: r.header,
        value: String(row[column]),
      });
    }
  });

  it('lists exactly the dead-letter headers of DLQ_HEADER, with the meaning wire.ts gives each', () => {
    const rows = table('DLQ_HEADER.');
    const said = documented('DLQ_HEADER');
    expect(Object.fromEntries(rows.map((r) => [r.key, r.header]))).toEqual(DLQ_HEADER);
    for (const r of rows) {
      expect({ key: r.key, meaning: r.meaning, setBy: r.setBy }).toEqual({
        key: r.key,
        meaning: said.get(r.key)!.meaning,
        setBy: 'inbox consumer',
      });
    }
  });
});
