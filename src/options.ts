import { z } from 'zod';
import type { Db } from './db/database.js';
import { isCairnDb } from './db/tenant.js';
import { ValidationError } from './errors.js';
import type { Logger } from './logger.js';
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

/**
 * Refuses a key an input object does not declare, naming it: TypeScript misses a key spread
 * in from a variable, and a silently ignored key can drop a guard (a `fence` that was renamed
 * `lease` would leave a write unfenced). `renamed` maps an old name to its new one.
 */
export function refuseUnknownKeys(
  what: string,
  input: object | undefined,
  allowed: readonly string[],
  renamed: Readonly<Record<string, string>> = {},
): void {
  if (input === undefined) return;
  const unknown = unknownKeys(input, allowed);
  if (unknown === undefined) return;
  throw new ValidationError(
    what,
    unknown.map((k) => ({
      path: k,
      message: renamed[k]
        ? `renamed to ${renamed[k]} (an option under its old name would be ignored)`
        : `is not an option here (known: ${allowed.join(', ')})`,
    })),
  );
}

/**
 * The keys of `input` not in `allowed`, or undefined when there is none: a loop that
 * allocates nothing on the common path, since TaskStore.update checks its input on every call.
 */
function unknownKeys(input: object, allowed: readonly string[]): string[] | undefined {
  let unknown: string[] | undefined;
  for (const k of Object.keys(input)) {
    if (allowed.includes(k)) continue;
    unknown ??= [];
    unknown.push(k);
  }
  return unknown;
}

type SameKeys<A, B> = [keyof A] extends [keyof B] ? ([keyof B] extends [keyof A] ? true : false) : false;
type Assignable<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;

/**
 * Ties a factory's zod schema to the option type it documents, at compile time: the same
 * keys, and values assignable both ways. An option added to the interface but not to the
 * schema (which, strict, would refuse it at run time), or the reverse, does not compile.
 * Usage: `const Schema = optionsSchema<RelayOptions>()(z.strictObject({ ... }))`.
 */
export function optionsSchema<T>() {
  return <S extends z.ZodType>(
    schema: S &
      (SameKeys<z.input<S>, T> extends true
        ? Assignable<z.input<S>, T> extends true
          ? unknown
          : { 'option types differ from the schema': T }
        : { 'option keys differ from the schema': T }),
  ): S => schema;
}

const hasMethods = (v: unknown, methods: readonly string[]): boolean =>
  typeof v === 'object' &&
  v !== null &&
  methods.every((m) => typeof (v as Record<string, unknown>)[m] === 'function');

/** An object with these methods (a publisher, a store, a key provider...): `what` says which. */
export const objectWith = <T>(what: string, ...methods: string[]) =>
  z.custom<T>((v) => hasMethods(v, methods), { message: `must be ${what}` });

/** The zod pieces the factories' schemas share. */
export const opt = {
  /**
   * A database made by createDb (or forTenant): Cairn's search_path and number parsing come
   * with it. A transaction, or a Kysely of the application's, is refused here rather than
   * failing later with a misleading "run cairn migrate".
   */
  db: () =>
    z.custom<Db>(isCairnDb, {
      message:
        'must be a database made by createDb() or forTenant() (not a transaction, nor a Kysely of your own: createDb({ pool }) runs Cairn on your pg.Pool)',
    }),
  logger: () => objectWith<Logger>('a pino Logger (createLogger())', 'child', 'info').optional(),
  fn: <F>(what = 'a function') => z.custom<F>((v) => typeof v === 'function', { message: `must be ${what}` }),
  /** A duration in milliseconds, more than 0 and within what a Node timer can wait (about 24.8 days). */
  ms: () =>
    z
      .number()
      .int()
      .positive()
      .max(2 ** 31 - 1, 'must be at most 2147483647 ms (a Node timer fires at once past it)'),
  count: () => z.number().int().positive(),
  text: () => z.string().min(1),
};
