import { type ParseArgsConfig, parseArgs } from 'node:util';
import { z } from 'zod';
import { ValidationError } from '../src/errors.js';
import { ExitCode } from '../src/exitCodes.js';
import { zodIssues } from '../src/schemas/zodIssues.js';
import { reportError, UsageError } from './output.js';

export interface ScriptCommandLine<S extends z.ZodType> {
  /** The npm script: `demo` is run as `npm run demo -- [flags]`. */
  name: string;
  /** What `--help` prints. */
  usage: string;
  /** The flags, as `parseArgs` takes them (with their defaults). */
  options: NonNullable<ParseArgsConfig['options']>;
  /** Checks the flags' values, keyed by flag name. */
  schema: S;
}

/**
 * The command line of a script run through npm (the demo, the chaos soak, the failover
 * harness), checked as `cairn` checks its own: `--help` prints the usage and exits 0; an
 * unknown flag, a stray argument or a bad value prints one line naming the flag, and where
 * the usage is, and exits 2. Either way the process ends here, before the script connects
 * to anything.
 */
export function parseScriptArgs<S extends z.ZodType>(
  cmd: ScriptCommandLine<S>,
  argv: string[] = process.argv.slice(2),
): Readonly<z.output<S>> {
  if (argv.includes('--help') || argv.includes('-h')) {
    console.log(cmd.usage);
    process.exit(ExitCode.ok);
  }
  try {
    const { values } = parseArgs({ args: argv, options: cmd.options, strict: true });
    const parsed = cmd.schema.safeParse(values);
    if (!parsed.success) {
      const issues = zodIssues(parsed.error, values).map((i) => ({ ...i, path: `--${i.path}` }));
      throw new ValidationError(`arguments to npm run ${cmd.name}`, issues);
    }
    return Object.freeze(parsed.data);
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    const usage = new UsageError(`${message} (usage: npm run ${cmd.name} -- --help)`, err);
    process.exit(reportError(usage, false, cmd.name));
  }
}

/** A flag holding a number, e.g. `--tasks 100`, with its bound: `{ above: 0 }` or `{ atLeast: 0.1 }`. */
export function numberFlag(bound: { above: number } | { atLeast: number }, opts: { integer?: boolean } = {}) {
  const ok = (n: number) => ('above' in bound ? n > bound.above : n >= bound.atLeast);
  return z
    .string()
    .refine((v) => /^\d+(\.\d+)?$/.test(v), { message: 'must be a number' })
    .transform(Number)
    .pipe(
      z
        .number()
        .refine((n) => !opts.integer || Number.isInteger(n), { message: 'must be a whole number' })
        .refine(ok, {
          message: 'above' in bound ? `must be > ${bound.above}` : `must be >= ${bound.atLeast}`,
        }),
    );
}

/** `--database`: a scratch database the script creates, so a plain lower-case SQL name. */
export const databaseFlag = z
  .string()
  .regex(/^[a-z_][a-z0-9_]{0,62}$/, { message: 'must be a plain lower-case name (a-z, 0-9, _)' });
