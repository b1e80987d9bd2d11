import type { z } from 'zod';
import { ValidationError } from '../src/errors.js';
import { parseOptions } from '../src/options.js';
import { UsageError } from './output.js';

export const defaultOperator = `spiffe://cairn.local/operator/${process.env.USER ?? 'unknown'}`;

/**
 * Checks what an operator typed for one sub-command before anything connects: the flags given
 * (a flag the sub-command does not take is refused, not ignored) and the positional argument
 * under its usage name. Throws a ValidationError naming each bad field and its value.
 */
export function operatorInput<S extends z.ZodType>(
  command: string,
  schema: S,
  input: { values: Record<string, unknown>; extra: readonly string[] },
): Readonly<z.output<S>> {
  if (input.extra.length > 0) {
    throw new ValidationError(`arguments to cairn ${command}`, [
      { path: 'arguments', message: 'unexpected extra argument(s)', value: input.extra },
    ]);
  }
  return parseOptions(`arguments to cairn ${command}`, schema, input.values);
}

/**
 * Runs a command so that bad input (a ValidationError, or a flag `parseArgs` does not know)
 * is a UsageError: exit 2 with the message, and nothing has been written.
 */
export async function exitTwoOnBadInput(run: () => Promise<number>): Promise<number> {
  try {
    return await run();
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (err instanceof ValidationError || code?.startsWith('ERR_PARSE_ARGS_')) {
      throw new UsageError((err as Error).message, err);
    }
    throw err;
  }
}
