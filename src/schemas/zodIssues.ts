import type { z } from 'zod';

/** Turns zod issues into `{ path, message, value }` with the offending value looked up in the input. */
export function zodIssues(
  error: z.ZodError,
  input: unknown,
): Array<{ path: string; message: string; value?: unknown }> {
  return error.issues.map((issue) => {
    const path = issue.path.map(String).join('.');
    let value: unknown = input;
    for (const key of issue.path) {
      value =
        value && typeof value === 'object'
          ? (value as Record<PropertyKey, unknown>)[key as PropertyKey]
          : undefined;
    }
    if (issue.code === 'unrecognized_keys') {
      const keys = (issue as { keys: string[] }).keys;
      return {
        path: path || '(root)',
        message: `unknown key(s) ${keys.map((k) => `"${k}"`).join(', ')} are not allowed`,
      };
    }
    return { path, message: issue.message, ...(value === undefined ? {} : { value }) };
  });
}
