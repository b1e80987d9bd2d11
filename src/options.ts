import type { z } from 'zod';
import { ValidationError } from './errors.js';
import { zodIssues } from './schemas/zodIssues.js';

/** Validates a factory's options object once and freezes the result. */
export function parseOptions<S extends z.ZodType>(
  what: string,
  schema: S,
  input: unknown,
): Readonly<z.output<S>> {
  const parsed = schema.safeParse(input);
  if (!parsed.success) throw new ValidationError(what, zodIssues(parsed.error, input));
  return Object.freeze(parsed.data);
}
