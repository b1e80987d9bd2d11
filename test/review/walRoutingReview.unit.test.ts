import { describe, expect, it } from 'vitest';
import { createWalRouting } from '../../relay/wal/walRouting.js';
import type { StreamRow } from '../../relay/wal/walRows.js';

// Review of relay/wal/walRouting.ts, driven as the relay's walStep drives it. A "table" is the
// set of rows the outbox still holds; a sweep claims from it within sweepBounds and deletes
// what it published; route() says what the stream publishes without looking at the table.

const row = (id: number, o: { key?: string; lane?: number } = {}): StreamRow => ({
  id,
  lane: o.lane ?? 0,
  message_id: `00000000-0000-0000-0000-${String(id).padStart(12, '0')}`,
  tenant_id: null,
  task_id: null,
  task_version: null,
  task_seq: null,
  topic: 't',
  key: o.key ?? 'k',
  headers: {},
  payload: Buffer.from(String(id)),
  created_ms: 0,
});

/** A sweep as walStep runs it: claims the table's rows of `lanes` within the bounds, publishes and deletes them. */
function sweep(
  r: ReturnType<typeof createWalRouting>,
  table: Map<number, StreamRow>,
  lanes: number[],
  published: number[],
) {
  const bounds = r.sweepBounds(lanes);
  const claimed = [...table.values()]
    .filter((x) => lanes.includes(x.lane) && x.id <= bounds[lanes.indexOf(x.lane)]!)
    .sort((a, b) => a.id - b.id);
  for (const x of claimed) {
    published.push(x.id);
    table.delete(x.id);
  }
  r.swept({ full: false, parkedBefore: new Set(), now: Date.now() });
}

/** What the stream hands over: published, or left in the table (route returns the first). */
function stream(r: ReturnType<typeof createWalRouting>, rows: StreamRow[], published: number[]) {
  for (const x of r.route(rows)) published.push(x.id);
}

describe('review: walRouting', () => {
  it('DUPLICATE: rows a held lane sweep already published and deleted (a broker blip) are published again when the stream hands them over', () => {
    const r = createWalRouting({ sweepEveryMs: 1000 });
    const table = new Map<number, StreamRow>();
    const published: number[] = [];
    r.lanesOwned(new Map([[0, 1]]));
    r.streamStarted(100);
    sweep(r, table, [0], published); // the start's sweep: nothing in the table
    // The stream hands over 101; the broker is down: the publish fails, 101 stays in the table.
    table.set(101, row(101));
    expect(r.route([row(101)]).map((x) => x.id)).toEqual([101]);
    r.holdAll(); // walStep's catch
    // Meanwhile 102 and 103 committed; the stream has them buffered, the relay has not taken them.
    table.set(102, row(102));
    table.set(103, row(103));
    // The broker is back. The held lane's sweep is unbounded: 101..103 go and leave the table.
    sweep(r, table, [0], published);
    expect(published).toEqual([101, 102, 103]);
    expect(table.size).toBe(0);
    // Then the stream hands over what it had buffered: the table no longer has 102, 103.
    stream(r, [row(102), row(103)], published);
    expect(published).toEqual([101, 102, 103]); // fails now: [101, 102, 103, 102, 103]
  });

  it('DUPLICATE / SKIPPED ROW PUBLISHED: a row of a lane another relay owned, published (or skipped by an operator) and deleted there, is published by the relay that takes the lane over once its stream hands it over', () => {
    const r = createWalRouting({ sweepEveryMs: 1000 });
    const table = new Map<number, StreamRow>();
    const published: number[] = [];
    r.lanesOwned(new Map([[0, 1]]));
    r.streamStarted(100);
    sweep(r, table, [0], published);
    // Row 150 of lane 20 commits; relay B owns lane 20 and sends it (or an operator skips it):
    // it leaves the table. This relay's stream has it buffered, behind other rows.
    // Relay B dies or releases lane 20 (a third relay joined); this relay takes it: held.
    r.lanesOwned(
      new Map([
        [0, 1],
        [20, 7],
      ]),
    );
    expect(r.held.lanes.has(20)).toBe(true);
    sweep(r, table, [0, 20], published); // lane 20 is empty in the table: drained
    expect(r.held.lanes.size).toBe(0);
    stream(r, [row(150, { lane: 20, key: 'x' })], published);
    expect(published).toEqual([]); // fails now: [150], a row the table no longer has
  });

  it('SKIPPED ROW PUBLISHED AFTER A RESTART: a tenant row with an id the sequence never gave out (its own INSERT ... (id, ...)) bypasses "ids given out before the stream started"', () => {
    const r = createWalRouting({ sweepEveryMs: 1000 });
    const table = new Map<number, StreamRow>();
    const published: number[] = [];
    // Before the crash: row 5_000_000 (explicit id, the tenant has INSERT on every column) was
    // published and deleted, or skipped by an operator; the slot was not confirmed past it.
    r.lanesOwned(new Map([[0, 1]]));
    r.streamStarted(1000); // outbox_id_seq's last value after the restart
    sweep(r, table, [0], published);
    stream(r, [row(5_000_000)], published); // the slot delivers it again
    expect(published).toEqual([]); // fails now: [5000000]
  });

  it('ORDER (concurrent writers of one key through outbox.enqueue in their own transactions): the periodic sweep bound lets a lower id that committed later go before a higher id that committed first', () => {
    const r = createWalRouting({ sweepEveryMs: 0 });
    const table = new Map<number, StreamRow>();
    const published: number[] = [];
    r.lanesOwned(new Map([[0, 1]]));
    r.streamStarted(100);
    sweep(r, table, [0], published);
    stream(r, [row(201, { key: 'other' })], published); // maxStreamedId = 201
    // Key K: P (id 210) commits first; E (id 150, a transaction that began earlier) commits after it.
    // Both are in the table, both buffered in the stream (P then E), not taken yet.
    table.set(210, row(210, { key: 'K' }));
    table.set(150, row(150, { key: 'K' }));
    sweep(r, table, [0], published); // bound max(201, 100): claims E only
    stream(r, [row(210, { key: 'K' }), row(150, { key: 'K' })], published);
    const firstK = [...new Set(published.filter((id) => id === 150 || id === 210))];
    expect(firstK).toEqual([210, 150]); // commit order; fails now: [150, 210] (and 150 twice)
  });
});
