import { describe, expect, it } from 'vitest';
import { createWalRouting } from '../../relay/wal/walRouting.js';
import { outboxRowOf, type StreamRow } from '../../relay/wal/walRows.js';

// The WAL mode's routing, driven step by step as relay/wal/walMode.ts drives it: which streamed
// rows the relay may publish at once (if the table still has them) and which wait in the table
// for the sweep, so a key's order holds on either path. A "table" is the rows the outbox holds;
// a sweep claims held lanes' or held keys' rows from it in id order and deletes what it sent.

const row = (id: number, key = 'k', lane = 1, xid = id + 1000): StreamRow => ({
  id,
  lane,
  message_id: `m-${id}`,
  tenant_id: null,
  task_id: null,
  task_version: null,
  task_seq: null,
  topic: 't',
  key,
  headers: {},
  payload: Buffer.alloc(0),
  created_ms: 0,
  xid,
});
const key = (k: string) => `\u0000t\u0000${k}`;
type Routing = ReturnType<typeof createWalRouting>;

let clock = 0;
function sweep(r: Routing, table: Map<number, StreamRow>, published: number[], parked = new Set<string>()) {
  clock += 10_000; // each sweep here comes a period after the last
  const due = r.sweepDue(clock);
  if (!due) return;
  const claimed = [...table.values()]
    .filter((x) => ('lanes' in due ? due.lanes.includes(x.lane) : due.keys.includes(key(x.key))))
    .filter((x) => !parked.has(key(x.key)))
    .sort((a, b) => a.id - b.id);
  for (const x of claimed) {
    published.push(x.id);
    table.delete(x.id);
  }
  r.swept(due, { full: false, parkedBefore: parked, now: clock });
}

/** The stream hands rows over: routed ones are published if the table still has them (walMode's check). */
function stream(r: Routing, table: Map<number, StreamRow>, rows: StreamRow[], published: number[]) {
  for (const x of r.route(rows).now) {
    if (!table.has(x.id)) continue;
    published.push(x.id);
    table.delete(x.id);
  }
}

function streaming(lanes = [1, 2]): Routing {
  const r = createWalRouting({ sweepEveryMs: 1000 });
  r.lanesOwned(new Map(lanes.map((l) => [l, 7])));
  r.holdAll(); // the stream started
  sweep(r, new Map(), []);
  return r;
}

describe('WAL routing (relay/wal/walRouting.ts)', () => {
  it('every lane is held when the stream starts, until a sweep of the lanes claimed everything', () => {
    const r = createWalRouting({ sweepEveryMs: 1000 });
    r.lanesOwned(new Map([[1, 7]]));
    r.holdAll();
    expect(r.route([row(1)]).now).toEqual([]);
    expect(r.sweepDue(0)).toEqual({ lanes: [1] });
    r.swept({ lanes: [1] }, { full: true, parkedBefore: new Set(), now: 0 }); // a limit cut it
    expect(r.route([row(2)]).now).toEqual([]);
    r.swept({ lanes: [1] }, { full: false, parkedBefore: new Set(), now: 0 });
    expect(r.route([row(3)]).now.map((x) => x.id)).toEqual([3]);
    expect(r.tableXids().sort()).toEqual([1001, 1002]);
  });

  it("a WAL message (no table row) that must wait goes to the table: its lane held or another relay's, its key held; otherwise it is published at once", () => {
    const msg = (id: number, key = 'k', lane = 1): StreamRow => ({ ...row(id, key, lane), emitted: true });
    const r = createWalRouting({ sweepEveryMs: 1000 });
    r.lanesOwned(new Map([[1, 7]]));
    r.holdAll();
    // Held lane: the message goes to the table (the sweep publishes it); no transaction to wait for.
    expect(r.route([msg(-1), row(5)])).toEqual({ now: [], toTable: [msg(-1)] });
    expect(r.tableXids()).toEqual([1005]);
    r.swept({ lanes: [1] }, { full: false, parkedBefore: new Set(), now: 0 });
    // Another relay's lane: to the table for its owner (a table row there is its owner's already).
    expect(r.route([msg(-2, 'x', 2), row(6, 'x', 2)])).toEqual({ now: [], toTable: [msg(-2, 'x', 2)] });
    // A held key waits behind its rows in the table; other keys go at once, in order.
    r.parked([key('p')]);
    expect(r.route([msg(-3, 'p'), msg(-4, 'q'), msg(-5, 'p')])).toEqual({
      now: [msg(-4, 'q')],
      toTable: [msg(-3, 'p'), msg(-5, 'p')],
    });
  });

  it('a parked key is held through sweeps until released; its rows follow in order; other keys flow', () => {
    const r = streaming();
    const table = new Map<number, StreamRow>();
    const published: number[] = [];
    const parked = new Set([key('p')]);
    r.parked(parked);
    for (const x of [row(1, 'p'), row(2, 'h'), row(3, 'p')]) table.set(x.id, x);
    stream(r, table, [row(1, 'p'), row(2, 'h'), row(3, 'p')], published);
    expect(published).toEqual([2]);
    sweep(r, table, published, parked);
    expect(published).toEqual([2]);
    table.set(4, row(4, 'p'));
    stream(r, table, [row(4, 'p')], published); // still parked: waits
    sweep(r, table, published); // released: the sweep sends 1, 3, 4 in id order
    table.set(5, row(5, 'p'));
    stream(r, table, [row(5, 'p')], published);
    expect(published).toEqual([2, 1, 3, 4, 5]);
  });

  it('held keys do not make every step a sweep (the stream would starve); the periodic one comes', () => {
    const r = streaming();
    r.parked([key('p')]);
    r.swept({ keys: [key('p')] }, { full: false, parkedBefore: new Set([key('p')]), now: 10_000 });
    expect(r.sweepDue(10_500)).toBeUndefined();
    expect(r.sweepDue(11_000)).toEqual({ keys: [key('p')] });
  });

  it('a lane taken again under a new token is held; a lane not owned is left to its owner', () => {
    const r = streaming();
    r.lanesOwned(new Map([[1, 8]])); // lane 1 taken again (another relay held it meanwhile); lane 2 lost
    expect(r.route([row(1, 'a', 1), row(2, 'b', 2)]).now).toEqual([]);
    expect(r.tableXids()).toEqual([1001]);
    expect(r.sweepDue(0)).toEqual({ lanes: [1] });
  });

  // From the adversarial review (each failed with the first design, which trusted the stream
  // for rows with ids past the sequence's value at its start, and swept by an id bound).
  it("review: rows a held lane's sweep sent after a failed publish are not sent again when the stream hands them over", () => {
    const r = streaming([0]);
    const table = new Map<number, StreamRow>();
    const published: number[] = [];
    table.set(101, row(101, 'k', 0));
    r.holdAll(); // the publish of 101 failed
    table.set(102, row(102, 'k', 0));
    table.set(103, row(103, 'k', 0));
    sweep(r, table, published);
    stream(r, table, [row(102, 'k', 0), row(103, 'k', 0)], published);
    expect(published).toEqual([101, 102, 103]);
  });

  it('review: a row another relay sent (or an operator skipped) on a lane taken over is not sent again', () => {
    const r = streaming([0]);
    const table = new Map<number, StreamRow>();
    const published: number[] = [];
    r.lanesOwned(
      new Map([
        [0, 7],
        [20, 7],
      ]),
    );
    sweep(r, table, published);
    stream(r, table, [row(150, 'x', 20)], published); // gone from the table
    expect(published).toEqual([]);
  });

  it('review: a row with an id the sequence never gave out, sent before a crash, is not sent again when the slot delivers it again', () => {
    const r = streaming([0]);
    const published: number[] = [];
    stream(r, new Map(), [row(5_000_000, 'k', 0)], published);
    expect(published).toEqual([]);
  });

  it('review: concurrent writers of one key: a row that committed later is not swept ahead of one that committed first', () => {
    const r = streaming([0]);
    const table = new Map<number, StreamRow>();
    const published: number[] = [];
    stream(r, table, [row(201, 'other', 0)], published);
    // P (id 210) commits first, E (id 150) after it; both in the table, both still in the stream.
    table.set(210, row(210, 'K', 0));
    table.set(150, row(150, 'K', 0));
    sweep(r, table, published); // nothing held: the sweep takes neither
    stream(r, table, [row(210, 'K', 0), row(150, 'K', 0)], published);
    expect(published).toEqual([210, 150]);
  });
});

describe('WAL rows (relay/wal/walRows.ts)', () => {
  it('the payload is a copy: the replication chunk it came from is reused by the next socket read (review)', () => {
    const chunk = Buffer.alloc(64, 0x41);
    const col = (b: Buffer) => new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    const int8 = (n: number) => {
      const b = Buffer.alloc(8);
      b.writeBigInt64BE(BigInt(n));
      return col(b);
    };
    const int4 = (n: number) => {
      const b = Buffer.alloc(4);
      b.writeInt32BE(n);
      return col(b);
    };
    const r = outboxRowOf({
      tag: 'insert',
      relation: undefined as never,
      new: {
        id: int8(7),
        lane: int4(3),
        message_id: col(Buffer.alloc(16, 1)),
        topic: col(Buffer.from('t')),
        key: col(Buffer.from('k')),
        headers: col(Buffer.from('\u0001{}')),
        payload: col(chunk.subarray(10, 20)),
        created_at: int8(0),
      },
    });
    chunk.fill(0x42); // the parser's buffer, reused
    expect(r.payload.toString()).toBe('A'.repeat(10));
    expect(r.id).toBe(7);
    expect(r.lane).toBe(3);
  });
});
