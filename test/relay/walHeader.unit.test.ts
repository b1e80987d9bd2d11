import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { type MessageHeader, NO_HEADERS, readHeader } from '../../relay/wal/walHeader.js';

// The WAL message header read byte by byte (relay/wal/walHeader.ts) must mean what JSON.parse
// makes of the same bytes, or step aside for it: a header read wrong is a message published
// under another id, key or tenant. The text is json_build_object's, as migration 0019's
// trigger writes it (test/relay/walHeader.int.test.ts checks against Postgres' own).

/** A header's fields, the writer's headers as a plain object (jsonb's text is written for them). */
type Fields = MessageHeader & { h: Record<string, string> };

/** What Postgres writes: `"name" : value`, joined by `, `; jsonb's own text for h. */
function pgText(f: Fields): string {
  const j = (v: unknown) => JSON.stringify(v);
  const h =
    Object.keys(f.h).length === 0
      ? '{}'
      : `{${Object.entries(f.h)
          .map(([k, v]) => `${j(k)}: ${j(v)}`)
          .join(', ')}}`;
  return `{"m" : ${j(f.m)}, "t" : ${j(f.t)}, "i" : ${j(f.i)}, "v" : ${j(f.v)}, "s" : ${j(f.s)}, "p" : ${j(f.p)}, "k" : ${j(f.k)}, "h" : ${h}, "c" : ${j(f.c)}}`;
}

/** A header inside a larger buffer, as the stream hands it on (bytes before and after it). */
function framed(text: string | Buffer): { b: Buffer; start: number; end: number } {
  const body = typeof text === 'string' ? Buffer.from(text) : text;
  const b = Buffer.concat([Buffer.from('pre"{}\\'), body, Buffer.from('"}post')]);
  return { b, start: 7, end: 7 + body.length };
}

/** A quote, a backslash or a control character: JSON writes it escaped. */
const needsEscape = (s: string) => [...s].some((ch) => ch === '"' || ch === '\\' || ch.charCodeAt(0) < 0x20);

function parsedOrThrown(b: Buffer, start: number, end: number): unknown {
  try {
    return JSON.parse(b.toString('utf8', start, end));
  } catch {
    return 'refused';
  }
}

const text = fc.string({ unit: 'binary', maxLength: 40 });
const integer = fc.oneof(
  fc.integer({ min: -1e6, max: 1e6 }),
  fc.maxSafeInteger(),
  fc.constantFrom(0, -0, 999_999_999_999_999, 1_000_000_000_000_000, 9_007_199_254_740_991),
);
const fields = fc.record({
  m: fc.oneof(fc.uuid(), text),
  t: fc.option(text),
  i: fc.option(text),
  v: fc.option(integer),
  s: fc.option(integer),
  p: fc.oneof(fc.constantFrom('orders', 'bench.modes.walmsg.kafkajs'), text),
  k: text,
  h: fc.oneof(fc.constant({}), fc.dictionary(text, text, { maxKeys: 3 })),
  c: fc.option(integer),
});

describe('readHeader', () => {
  it('reads the common header (no escapes, no headers) without JSON.parse, to the same values', () => {
    const f: Fields = {
      m: '0193a3b4-5c6d-7e8f-9a0b-1c2d3e4f5a6b',
      t: 'acme',
      i: 'task-ü-1',
      v: 12,
      s: 0,
      p: 'orders',
      k: 'key-😀',
      h: {},
      c: 1_764_633_600_123,
    };
    const { b, start, end } = framed(pgText(f));
    const h = readHeader(b, start, end);
    expect(h).toEqual(f);
    expect(h?.h).toBe(NO_HEADERS);
    expect(Object.isFrozen(NO_HEADERS)).toBe(true);
  });

  it('leaves escapes, headers, fractions and long numbers to JSON.parse', () => {
    const base: Fields = { m: 'id', t: null, i: null, v: null, s: null, p: 'p', k: 'k', h: {}, c: null };
    for (const f of [
      { ...base, k: 'a"b' },
      { ...base, t: 'tab\there' },
      { ...base, h: { a: 'b' } },
      { ...base, c: 1_000_000_000_000_000 },
    ]) {
      const { b, start, end } = framed(pgText(f));
      expect(readHeader(b, start, end)).toBeUndefined();
    }
    for (const raw of [
      '{"m" : "id", "t" : null, "i" : null, "v" : 1.5, "s" : null, "p" : "p", "k" : "k", "h" : {}, "c" : null}',
      '{"m" : "id", "t" : null, "i" : null, "v" : 01, "s" : null, "p" : "p", "k" : "k", "h" : {}, "c" : null}',
      '{"m" : "id", "t" : null, "i" : null, "v" : null, "s" : null, "p" : "p", "k" : "k", "h" : {}, "c" : null} ',
    ]) {
      const { b, start, end } = framed(raw);
      expect(readHeader(b, start, end)).toBeUndefined();
    }
  });

  it('whatever the values, agrees with JSON.parse whenever it reads a header, and reads every header without escapes or headers', () => {
    fc.assert(
      fc.property(fields, (f) => {
        const { b, start, end } = framed(pgText(f));
        const h = readHeader(b, start, end);
        const parsed = JSON.parse(b.toString('utf8', start, end));
        if (h !== undefined) expect(h).toEqual(parsed);
        const plain = (s: string | null) => s === null || !needsEscape(s);
        const exact = (n: number | null) => n === null || Math.abs(n) < 1e15;
        if (
          [f.m, f.t, f.i, f.p, f.k].every(plain) &&
          [f.v, f.s, f.c].every(exact) &&
          Object.keys(f.h).length === 0 &&
          [f.m, f.t, f.i, f.p, f.k].every((s) => s === null || Buffer.from(s).toString() === s)
        )
          expect(h).toBeDefined();
      }),
      { numRuns: 2000 },
    );
  });

  it('bytes changed anywhere: refused where JSON.parse refuses, the same values where it reads them', () => {
    fc.assert(
      fc.property(
        fields,
        fc.array(
          fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 }), fc.constantFrom('set', 'insert', 'delete')),
          {
            minLength: 1,
            maxLength: 3,
          },
        ),
        (f, edits) => {
          const bytes = [...Buffer.from(pgText({ ...f, h: {} }))];
          for (const [at, byte, how] of edits) {
            const i = at % (bytes.length + 1);
            if (how === 'set' && i < bytes.length) bytes[i] = byte;
            else if (how === 'insert') bytes.splice(i, 0, byte);
            else bytes.splice(i, 1);
          }
          const { b, start, end } = framed(Buffer.from(bytes));
          const h = readHeader(b, start, end);
          const parsed = parsedOrThrown(b, start, end);
          if (h !== undefined) expect(h).toEqual(parsed);
        },
      ),
      { numRuns: 3000 },
    );
  });

  it('invalid UTF-8 beside the quotes: the same text as JSON.parse makes of the whole header', () => {
    for (const bad of [0x80, 0xbf, 0xc0, 0xc3, 0xe2, 0xed, 0xf0, 0xf4, 0xff]) {
      const text = pgText({ m: 'id', t: 'T', i: null, v: 1, s: null, p: 'orders', k: 'K', h: {}, c: null });
      const bytes = Buffer.from(text);
      for (const at of [text.indexOf('"T"') + 1, text.indexOf('"K"') + 1]) {
        const edited = Buffer.from(bytes);
        edited[at] = bad;
        const { b, start, end } = framed(edited);
        const h = readHeader(b, start, end);
        expect(h).toBeDefined();
        expect(h).toEqual(JSON.parse(b.toString('utf8', start, end)));
      }
    }
  });

  it('a buffer written over after it was read: the next topic is read from the new bytes', () => {
    const f: Fields = { m: 'a', t: null, i: null, v: null, s: null, p: 'orders', k: 'k', h: {}, c: null };
    const { b, start, end } = framed(pgText(f));
    expect(readHeader(b, start, end)?.p).toBe('orders');
    b.write('orderz', b.indexOf('orders'), 'latin1'); // pg-protocol reuses its read buffer
    expect(readHeader(b, start, end)?.p).toBe('orderz');
  });

  it('reuses the last topic string only for the same bytes', () => {
    const f: Fields = { m: 'a', t: null, i: null, v: null, s: null, p: 'orders', k: 'k', h: {}, c: null };
    const one = framed(pgText(f));
    const two = framed(pgText({ ...f, p: 'orderz' }));
    const three = framed(pgText({ ...f, p: 'orders.dlq' }));
    expect(readHeader(one.b, one.start, one.end)?.p).toBe('orders');
    expect(readHeader(two.b, two.start, two.end)?.p).toBe('orderz');
    expect(readHeader(three.b, three.start, three.end)?.p).toBe('orders.dlq');
    expect(readHeader(one.b, one.start, one.end)?.p).toBe('orders');
  });
});
