import fc from 'fast-check';
import pg from 'pg';
import { afterAll, beforeAll, expect, inject, it } from 'vitest';
import { readHeader } from '../../relay/wal/walHeader.js';

// The header as Postgres itself writes it (migration 0019's expression, the same casts): the
// byte-by-byte reader either steps aside or reads what JSON.parse reads, for any values the
// outbox takes. The unit test covers Postgres' format as written in JavaScript; this one
// covers what a server version actually prints.

let client: pg.Client;
beforeAll(async () => {
  client = new pg.Client({ connectionString: inject('databaseUrl') });
  await client.connect();
});
afterAll(() => client.end());

/** A quote, a backslash or a control character: JSON writes it escaped. */
const needsEscape = (s: string) => [...s].some((ch) => ch === '"' || ch === '\\' || ch.charCodeAt(0) < 0x20);

const noNul = (s: string) => s.replaceAll('\u0000', '');
const text = fc.string({ unit: 'grapheme', maxLength: 30 }).map(noNul);
const anyText = fc.oneof(
  text,
  fc.string({ unit: 'binary', maxLength: 30 }).map(noNul),
  fc.constantFrom('a"b', 'c\\d', 'tab\t', 'ü😀'),
);

it('reads json_build_object as JSON.parse does, and reads it itself for plain values', async () => {
  const cases = fc.sample(
    fc.record({
      t: fc.option(anyText),
      i: fc.option(anyText),
      v: fc.option(fc.integer({ min: 0, max: 2 ** 31 })),
      s: fc.option(fc.integer({ min: 0, max: 1000 })),
      p: fc.constantFrom('orders', 'a.b-c_9'),
      k: anyText,
      h: fc.oneof(fc.constant('{}'), fc.constant('{"x": "y"}')),
      at: fc.constantFrom(
        'now()',
        "'1969-12-31 23:59:59.5+00'",
        "'infinity'",
        "'2026-12-02 10:00:00.123456+00'",
      ),
    }),
    { numRuns: 300, seed: 16 },
  );
  let read = 0;
  for (const c of cases) {
    const { rows } = await client.query<{ header: Buffer }>(
      `SELECT convert_to(json_build_object(
         'm', gen_random_uuid(), 't', $1::text, 'i', $2::text, 'v', $3::bigint, 's', $4::int,
         'p', $5::text, 'k', $6::text, 'h', $7::jsonb,
         'c', CASE WHEN isfinite(${c.at}::timestamptz) THEN floor(extract(epoch FROM ${c.at}::timestamptz) * 1000) END
       )::text, 'UTF8') AS header`,
      [c.t, c.i, c.v, c.s, c.p, c.k, c.h],
    );
    const b = rows[0]!.header;
    const h = readHeader(b, 0, b.length);
    const parsed = JSON.parse(b.toString('utf8'));
    if (h !== undefined) {
      expect(h).toEqual(parsed);
      read++;
    }
    const plain = [c.t, c.i, c.k].every((s) => s === null || !needsEscape(s));
    if (plain && c.h === '{}') expect(h, b.toString()).toBeDefined();
  }
  expect(read).toBeGreaterThan(50);
});
