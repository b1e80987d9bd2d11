import { describe, expect, it } from 'vitest';
import { createWalRouting } from '../../relay/wal/walRouting.js';
import type { StreamRow } from '../../relay/wal/walRows.js';

// The WAL mode's routing, driven step by step: which streamed rows the relay may publish at
// once and which wait in the table for the sweep, so a key's order holds on either path.

const row = (id: number, key: string, lane = 1, xid = id + 1000): StreamRow => ({
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
const ids = (rows: readonly StreamRow[]) => rows.map((r) => r.id);
const owned = new Map([
  [1, 7],
  [2, 7],
]);

function streaming(lastIssuedId = 0) {
  const r = createWalRouting({ sweepEveryMs: 1000 });
  r.lanesOwned(owned);
  r.streamStarted(lastIssuedId);
  r.swept({ full: false, parkedBefore: new Set(), now: 0 }); // the start's drain
  return r;
}

describe('WAL routing (relay/wal/walRouting.ts)', () => {
  it('publishes nothing before the stream started, and holds every lane at the start until a complete sweep', () => {
    const r = createWalRouting({ sweepEveryMs: 1000 });
    r.lanesOwned(owned);
    expect(ids(r.route([row(1, 'a')]))).toEqual([]);
    r.streamStarted(0);
    expect(r.sweepDue(0)).toBe(true);
    expect(r.sweepBounds([1, 2])).toEqual([Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER]);
    r.swept({ full: true, parkedBefore: new Set(), now: 0 }); // a limit cut it: more may wait
    expect(ids(r.route([row(2, 'a')]))).toEqual([]);
    r.swept({ full: false, parkedBefore: new Set(), now: 0 });
    expect(ids(r.route([row(3, 'a')]))).toEqual([3]);
  });

  it("a row with an id given out before the stream started goes through the table, and so do its key's later rows until a sweep drained them", () => {
    const r = streaming(10);
    expect(ids(r.route([row(9, 'a'), row(11, 'b'), row(12, 'a')]))).toEqual([11]);
    expect(r.held.keys.size).toBe(1);
    expect(r.tableXids().sort()).toEqual([1009, 1012]);
    // The sweep may claim every id up to the stream's start and what it delivered.
    expect(r.sweepBounds([1])).toEqual([12]);
    r.swept({ full: false, parkedBefore: new Set(), now: 5000 });
    expect(r.tableXids()).toEqual([]);
    expect(ids(r.route([row(13, 'a')]))).toEqual([13]);
  });

  it('a parked key stays held through sweeps until it is no longer parked; other keys flow meanwhile', () => {
    const r = streaming();
    const parked = new Set(['\u0000t\u0000p']);
    r.parked(parked);
    expect(ids(r.route([row(1, 'p'), row(2, 'h')]))).toEqual([2]);
    r.swept({ full: false, parkedBefore: parked, now: 2000 });
    expect(ids(r.route([row(3, 'p'), row(4, 'h')]))).toEqual([4]);
    // Released (skip or release): the next complete sweep publishes its rows, then the stream takes over.
    r.swept({ full: false, parkedBefore: new Set(), now: 4000 });
    expect(ids(r.route([row(5, 'p')]))).toEqual([5]);
  });

  it('held keys do not make every step a sweep (the stream would starve), the periodic one still comes', () => {
    const r = streaming();
    r.parked(['\u0000t\u0000p']);
    expect(r.sweepDue(500)).toBe(false);
    expect(r.sweepDue(1000)).toBe(true);
  });

  it('a lane taken again under a new token is held; a lane not owned is left to its owner, untracked', () => {
    const r = streaming();
    r.lanesOwned(new Map([[1, 8]])); // lane 1 taken again (another relay held it meanwhile); lane 2 lost
    expect(ids(r.route([row(1, 'a', 1), row(2, 'b', 2)]))).toEqual([]);
    expect(r.tableXids()).toEqual([1001]);
    expect(r.sweepDue(0)).toBe(true);
    expect(r.sweepBounds([1])).toEqual([Number.MAX_SAFE_INTEGER]);
  });

  it('after a failure every lane is held again (what was taken is in the table)', () => {
    const r = streaming();
    r.holdAll();
    expect(ids(r.route([row(1, 'a')]))).toEqual([]);
    expect(r.held.lanes.size).toBe(2);
  });
});
