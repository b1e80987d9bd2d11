/**
 * A Postgres array literal of integers (`{1,2,3}`), passed as one text parameter and cast in
 * SQL (`$1::bigint[]`). pg serializes a JS array element by element, quoting and escaping
 * each (escapeElement, arrayString, prepareValue: the top pg frames in a CPU profile of a
 * drain); the relay sends about three ids per published message (two batches excluded per
 * claim, one batch per delete): 0.25 us of Node per message that way, 0.05 us joined.
 */
export function intArray(values: readonly number[]): string {
  for (const v of values) {
    if (!Number.isSafeInteger(v)) throw new TypeError(`not an integer: ${v}`);
  }
  return `{${values.join(',')}}`;
}
