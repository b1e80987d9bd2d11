import { CairnError } from '../src/errors.js';
import { ExitCode, exitCodeFor } from '../src/exitCodes.js';

/** Wrong arguments (an unknown command or flag, a missing or malformed value): exit 2. */
export class UsageError extends CairnError {
  constructor(message: string, cause?: unknown) {
    super('usage', message, { cause });
  }
}

/** `--json` given before any `--`: results go to stdout and errors to stderr as JSON. */
export function wantsJson(argv: readonly string[]): boolean {
  const end = argv.indexOf('--');
  return (end === -1 ? argv : argv.slice(0, end)).includes('--json');
}

/** A command's result: the data as JSON with --json, else the readable lines `text` prints. */
export function printResult(json: boolean | undefined, data: unknown, text: () => void): void {
  if (json) console.log(JSON.stringify(data, null, 2));
  else text();
}

/** What an error means to a script: its stable code, its message, and whether to retry. */
export function describeError(err: unknown): { code: string; message: string; retriable: boolean } {
  if (err instanceof CairnError) return { code: err.code, message: err.message, retriable: err.retriable };
  const e = err as NodeJS.ErrnoException | undefined;
  // node:util parseArgs refusing a flag is an operator's typo, like any usage error.
  if (typeof e?.code === 'string' && e.code.startsWith('ERR_PARSE_ARGS_')) {
    return { code: 'usage', message: e.message, retriable: false };
  }
  // Not Cairn's: kafkajs's errors carry `retriable` too, which is worth passing on.
  const retriable = (err as { retriable?: unknown } | undefined)?.retriable === true;
  return { code: 'unexpected', message: e instanceof Error ? e.message : String(err), retriable };
}

/** The exit code for an error: 2 for usage, the rest as src/exitCodes.ts says. */
export function cliExitCode(err: unknown): number {
  return describeError(err).code === 'usage' ? ExitCode.usage : exitCodeFor(err);
}

/**
 * Prints an error on stderr, as one JSON object `{"error":{"code","message","retriable"}}`
 * with --json (one line, so a script can parse stderr whole) or as `cairn: [code] message`
 * (`demo: ...` for the npm scripts), and returns the exit code, which is the same either way.
 */
export function reportError(err: unknown, json: boolean, program = 'cairn'): number {
  const d = describeError(err);
  if (json) process.stderr.write(`${JSON.stringify({ error: d })}\n`);
  else {
    // Escaped: a message quotes values a tenant wrote (a task id). A usage error's lines are
    // Cairn's own text and the operator's own arguments: its line breaks stay.
    const message =
      err instanceof UsageError ? d.message.split('\n').map(printable).join('\n') : printable(d.message);
    process.stderr.write(`${program}: ${d.code === 'unexpected' ? '' : `[${d.code}] `}${message}\n`);
  }
  return cliExitCode(err);
}

/**
 * Control characters (C0, C1, DEL), the Unicode line separators, and every format character
 * (Cf: bidirectional marks, embeddings, overrides and isolates, whose reordering is not what the
 * operator reads, "Trojan Source"; zero-width characters, soft hyphens, tag characters), with the
 * blank fillers and variation selectors: two ids that differ only by them look the same.
 */
const UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\u115f\u1160\u3164]|\p{Variation_Selector}/gu;

/**
 * Any of UNPRINTABLE in a value as an escape (`\n`, `\u001b`): strings a tenant wrote with its own SQL (an audit reason, an outbox key)
 * would otherwise reach the operator's terminal as escape sequences (erase a line, write the
 * clipboard) or as newlines and tabs that forge another row of a listing.
 */
export function printable(value: unknown): string {
  return String(value).replace(UNPRINTABLE, (c) => {
    if (c === '\n') return '\\n';
    if (c === '\t') return '\\t';
    if (c === '\r') return '\\r';
    const code = c.codePointAt(0)!;
    return code > 0xffff ? `\\u{${code.toString(16)}}` : `\\u${code.toString(16).padStart(4, '0')}`;
  });
}

/** A template tag for readable output: every value it interpolates goes through printable(). */
export function line(strings: TemplateStringsArray, ...values: unknown[]): string {
  let out = strings[0] ?? '';
  for (let i = 0; i < values.length; i++) out += printable(values[i]) + (strings[i + 1] ?? '');
  return out;
}
