import type { StreamRow } from './walRows.js';

/** A parked or held key: tenant ('' for none), topic and key, as relay/publishBatch.ts keyOf spells it. */
export const streamKeyOf = (r: { tenant_id: string | null; topic: string; key: string }) =>
  `${r.tenant_id ?? ''}\u0000${r.topic}\u0000${r.key}`;

/**
 * Which rows the WAL stream may publish, and which wait for the sweep that reads the outbox
 * table, so that both never break a key's order.
 *
 * The table is the authority (a row leaves it only after the broker's ack); the stream is a
 * faster way to learn of new rows. A streamed row goes through the table (the stream skips it,
 * the sweep publishes it) when its lane is held, or its key is, or it may be a row the stream
 * delivers again:
 * - a lane is held from the moment this relay takes it (another relay may have left rows in
 *   it) or (re)starts its stream, until a sweep drained the lane's rows from the table;
 * - a key is held while it is parked, and from the moment the stream skipped one of its rows
 *   until a sweep published every row of it the stream had delivered by then;
 * - a row with an id the sequence had given out before the stream started may be one that was
 *   published, or deleted by an operator (`cairn outbox skip`), before a crash: only the table
 *   says whether it is still to be sent.
 * A key's rows that wait in the table are published by the sweep in id order, and the stream
 * skips its later rows meanwhile: order per key holds whichever path a row takes.
 */
export interface WalRouting {
  /** Lanes now owned with their tokens: a lane new to this relay, or taken again (a new token), is held. */
  lanesOwned(owned: ReadonlyMap<number, number>): void;
  /** The stream (re)started: every owned lane is held, and rows up to `lastIssuedId` go through the table. */
  streamStarted(lastIssuedId: number): void;
  /** A publish failed or the stream broke: everything goes through the table until the next drain. */
  holdAll(): void;
  /** Keys now parked (the relay parked one, or the sweep read them): held until released and drained. */
  parked(keys: Iterable<string>): void;
  /** Splits taken rows: those to publish now, in order; the others stay in the table for the sweep. */
  route(rows: readonly StreamRow[]): StreamRow[];
  /**
   * Transactions whose rows the stream left to the table since the last complete sweep. The
   * walsender may send a commit before the committing backend has left the proc array: for a
   * moment the row is not yet visible to a new snapshot. A sweep that ran then would miss it
   * and release its key while the row still waits; the relay sweeps only once these are
   * visible (relay/wal/walVisibility.ts).
   */
  tableXids(): number[];
  /** Whether the next step is a sweep of the table (a held lane, or the periodic one). */
  sweepDue(now: number): boolean;
  /**
   * Per lane, the highest id the sweep may claim: all of a held lane; else what the stream
   * delivered, and every id given out before it started (a held key's rows may be among them).
   */
  sweepBounds(lanes: readonly number[]): number[];
  /**
   * A sweep claimed (`full`: a limit cut it) with these keys parked when it started. A sweep that
   * got everything drained its held lanes and every held key no longer parked.
   */
  swept(o: { full: boolean; parkedBefore: ReadonlySet<string>; now: number }): void;
  /** For stats and tests. */
  readonly held: { lanes: ReadonlySet<number>; keys: ReadonlySet<string> };
}

const UNBOUNDED = Number.MAX_SAFE_INTEGER;

export function createWalRouting(o: { sweepEveryMs: number }): WalRouting {
  let owned = new Map<number, number>();
  const heldLanes = new Set<number>();
  const heldKeys = new Set<string>();
  let throughTableUpTo = UNBOUNDED; // until the stream starts, nothing is published from it
  let maxStreamedId = 0;
  let lastSweep = 0;
  const xids = new Set<number>();

  return {
    lanesOwned(next) {
      for (const [lane, token] of next) if (owned.get(lane) !== token) heldLanes.add(lane);
      for (const lane of heldLanes) if (!next.has(lane)) heldLanes.delete(lane);
      owned = new Map(next);
    },
    streamStarted(lastIssuedId) {
      throughTableUpTo = lastIssuedId;
      for (const lane of owned.keys()) heldLanes.add(lane);
    },
    holdAll() {
      for (const lane of owned.keys()) heldLanes.add(lane);
    },
    parked(keys) {
      for (const k of keys) heldKeys.add(k);
    },
    route(rows) {
      const out: StreamRow[] = [];
      for (const r of rows) {
        if (r.id > maxStreamedId) maxStreamedId = r.id;
        if (!owned.has(r.lane)) continue; // its owner reads it from the table
        if (heldLanes.has(r.lane)) {
          xids.add(r.xid); // the sweep reads it from the table
          continue;
        }
        const k = streamKeyOf(r);
        if (r.id <= throughTableUpTo || heldKeys.has(k)) {
          heldKeys.add(k);
          xids.add(r.xid);
          continue;
        }
        out.push(r);
      }
      return out;
    },
    tableXids() {
      return [...xids];
    },
    sweepDue(now) {
      for (const lane of heldLanes) if (owned.has(lane)) return true;
      // Held keys wait for the periodic sweep: a parked key may stay parked for days, and a
      // sweep on every step would starve the stream (every other key would wait behind it).
      return now - lastSweep >= o.sweepEveryMs;
    },
    sweepBounds(lanes) {
      // Rows the stream never delivered, or delivered to be read from the table, are the
      // sweep's; a later row the stream has not delivered yet is left to it.
      const bound = Math.max(maxStreamedId, throughTableUpTo);
      return lanes.map((l) => (heldLanes.has(l) ? UNBOUNDED : bound));
    },
    swept({ full, parkedBefore, now }) {
      if (full) return;
      lastSweep = now;
      heldLanes.clear();
      xids.clear();
      for (const k of heldKeys) if (!parkedBefore.has(k)) heldKeys.delete(k);
    },
    held: { lanes: heldLanes, keys: heldKeys },
  };
}
