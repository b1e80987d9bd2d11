import { afterEach, describe, expect, it, vi } from 'vitest';
import { printable, reportError } from '../../cli/output.js';
import { NotFoundError } from '../../src/errors.js';

// What a tenant writes reaches an operator's terminal through values and through error
// messages that quote them (a task id in "not found"). Bidirectional overrides reorder what the
// operator reads (the "Trojan Source" characters) and zero-width characters make two different
// ids look the same: escaped like control characters.
describe('printable', () => {
  it('escapes bidirectional controls and zero-width characters', () => {
    expect(printable('pay\u202Eevil\u202C-task\u200B\u2066x\u2069\uFEFF\u061C')).toBe(
      'pay\\u202eevil\\u202c-task\\u200b\\u2066x\\u2069\\ufeff\\u061c',
    );
    expect(printable('id\u00ad-\u3164\ufe0f\u{e0041}')).toBe('id\\u00ad-\\u3164\\ufe0f\\u{e0041}');
    expect(printable('plain ünïcödé, 日本, emoji 🙂')).toBe('plain ünïcödé, 日本, emoji 🙂');
  });
});

describe('reportError', () => {
  afterEach(() => {
    vi.restoreAllMocks();
  });

  it('escapes what the error message quotes', () => {
    let written = '';
    vi.spyOn(process.stderr, 'write').mockImplementation((s: string | Uint8Array) => {
      written += String(s);
      return true;
    });
    reportError(new NotFoundError('task', `t-1\u001b[2K\nforged line\u202E`), false);
    expect(written.includes('\u001b') || written.includes('\u202E')).toBe(false);
    expect(written.trimEnd().split('\n')).toHaveLength(1);
    expect(written).toContain('t-1\\u001b[2K\\nforged line\\u202e');
  });
});
