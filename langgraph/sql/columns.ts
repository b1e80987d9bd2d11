/**
 * Rows as one array per column, in row order: the shape `unnest($1::text[], $2::bytea[], ...)`
 * takes, so a batch of rows is one statement.
 */
export function toColumns<T, K extends keyof T>(
  rows: readonly T[],
  keys: readonly K[],
): { [P in K]: T[P][] } {
  const out = {} as { [P in K]: T[P][] };
  for (const k of keys) out[k] = rows.map((r) => r[k]);
  return out;
}
