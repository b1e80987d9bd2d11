/**
 * The header of an outbox WAL message, as migration 0019's trigger writes it: the text of
 * `json_build_object('m', message_id, 't', tenant_id, 'i', task_id, 'v', task_version,
 * 's', task_seq, 'p', topic, 'k', key, 'h', headers, 'c', created ms)`, which Postgres spells
 * `{"m" : "…", "t" : null, …, "h" : {}, "c" : 1764633600000}`.
 */
export interface MessageHeader {
  m: string;
  t: string | null;
  i: string | null;
  v: number | null;
  s: number | null;
  p: string;
  k: string;
  h: unknown;
  c: number | null;
}

/** A message's headers when the writer gave none (most messages): one object, never changed. */
export const NO_HEADERS: Readonly<Record<string, string>> = Object.freeze({});

const bytes = (s: string) => new Uint8Array(Buffer.from(s, 'latin1'));
const OPEN_M = bytes('{"m" : ');
const T = bytes(', "t" : ');
const I = bytes(', "i" : ');
const V = bytes(', "v" : ');
const S = bytes(', "s" : ');
const P = bytes(', "p" : ');
const K = bytes(', "k" : ');
const EMPTY_H_THEN_C = bytes(', "h" : {}, "c" : ');
const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * The header read byte by byte, for the shape the trigger writes when the writer gave no
 * headers and no string needs an escape (what nearly every message is); `undefined` for
 * anything else, which the caller reads with JSON.parse. JSON.parse of this ~200-byte text
 * (and its decoding) took 1.35 µs per message, this 0.8 (medians, 2,000 such headers read
 * over and over): the largest part of the WAL messages relay's own work per message. Whatever this returns is what JSON.parse returns for the same bytes
 * (test/relay/walHeader.unit.test.ts and walHeader.int.test.ts compare them).
 */
export function readHeader(b: Buffer, start: number, end: number): MessageHeader | undefined {
  let at = literal(b, start, end, OPEN_M);
  const m0 = at;
  at = stringEnd(b, at, end);
  if (at < 0) return undefined;
  const m1 = at;
  at = literal(b, at, end, T);
  const t0 = at;
  at = nullOrStringEnd(b, at, end);
  if (at < 0) return undefined;
  const t1 = at;
  at = literal(b, at, end, I);
  const i0 = at;
  at = nullOrStringEnd(b, at, end);
  if (at < 0) return undefined;
  const i1 = at;
  at = literal(b, at, end, V);
  const v = integerAt(b, at, end);
  if (v === undefined) return undefined;
  at = literal(b, integerEnd, end, S);
  const s = integerAt(b, at, end);
  if (s === undefined) return undefined;
  at = literal(b, integerEnd, end, P);
  const p0 = at;
  at = stringEnd(b, at, end);
  if (at < 0) return undefined;
  const p1 = at;
  at = literal(b, at, end, K);
  const k0 = at;
  at = stringEnd(b, at, end);
  if (at < 0) return undefined;
  const k1 = at;
  at = literal(b, at, end, EMPTY_H_THEN_C);
  const c = integerAt(b, at, end);
  // The closing brace, and nothing after it.
  if (c === undefined || integerEnd !== end - 1 || b[integerEnd] !== 0x7d) return undefined;
  return {
    m: text(b, m0, m1),
    t: b[t0] === QUOTE ? text(b, t0, t1) : null,
    i: b[i0] === QUOTE ? text(b, i0, i1) : null,
    v,
    s,
    p: topic(b, p0, p1),
    k: text(b, k0, k1),
    h: NO_HEADERS,
    c,
  };
}

/** Past the literal `l` at `at`, or -1 (so every later step fails: -1 is never a quote). */
function literal(b: Buffer, at: number, end: number, l: Uint8Array): number {
  if (at < 0 || at + l.length > end) return -1;
  for (let j = 0; j < l.length; j++) if (b[at + j] !== l[j]) return -1;
  return at + l.length;
}

/** Past the closing quote of a string without escapes that opens at `at`, or -1. */
function stringEnd(b: Buffer, at: number, end: number): number {
  if (at < 0 || b[at] !== QUOTE) return -1;
  for (let e = at + 1; e < end; e++) {
    const c = b[e]!;
    if (c === QUOTE) return e + 1;
    if (c === BACKSLASH || c < 0x20) return -1; // an escape, or what JSON.parse refuses
  }
  return -1;
}

/** Whether `null` is at `at`. */
const isNull = (b: Buffer, at: number, end: number) =>
  at >= 0 &&
  at + 4 <= end &&
  b[at] === 0x6e &&
  b[at + 1] === 0x75 &&
  b[at + 2] === 0x6c &&
  b[at + 3] === 0x6c;

function nullOrStringEnd(b: Buffer, at: number, end: number): number {
  return isNull(b, at, end) ? at + 4 : stringEnd(b, at, end);
}

/** A string's text from its opening quote at `from` to past its closing one at `to`. */
function text(b: Buffer, from: number, to: number): string {
  return b.toString(isAscii(b, from + 1, to - 1) ? 'latin1' : 'utf8', from + 1, to - 1);
}

function isAscii(b: Buffer, from: number, to: number): boolean {
  let high = 0;
  for (let j = from; j < to; j++) high |= b[j]!;
  return high < 0x80;
}

/** Where the last integer read ends. */
let integerEnd = 0;

/**
 * `null` or an integer of at most 15 digits (exact as a double, as JSON.parse reads it) at
 * `at`; undefined for anything else (a fraction, an exponent, more digits: JSON.parse decides).
 */
function integerAt(b: Buffer, at: number, end: number): number | null | undefined {
  if (at < 0) return undefined;
  if (isNull(b, at, end)) {
    integerEnd = at + 4;
    return null;
  }
  const negative = b[at] === 0x2d;
  const first = negative ? at + 1 : at;
  let e = first;
  let n = 0;
  for (; e < end && e - first < 16; e++) {
    const d = b[e]! - 0x30;
    if (d < 0 || d > 9) break;
    n = n * 10 + d;
  }
  const digits = e - first;
  // JSON has no leading zeros; 16 digits may round: JSON.parse decides those.
  if (digits === 0 || digits > 15 || (digits > 1 && b[first] === 0x30)) return undefined;
  integerEnd = e;
  return negative ? -n : n;
}

/** The last topic read, and its bytes: a relay's messages mostly go to a few topics. */
let lastTopic = '';
let lastTopicBytes = new Uint8Array(0);

/** A topic's text, the same string as the last one's when its bytes are the same (one string to hash downstream). */
function topic(b: Buffer, from: number, to: number): string {
  const last = lastTopicBytes;
  const n = to - from - 2;
  if (n === last.length) {
    let j = 0;
    while (j < n && b[from + 1 + j] === last[j]) j++;
    if (j === n) return lastTopic;
  }
  lastTopic = text(b, from, to);
  lastTopicBytes = new Uint8Array(b.subarray(from + 1, to - 1));
  return lastTopic;
}
