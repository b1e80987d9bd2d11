import type { StreamRow } from './walRows.js';

/** A parked or held key: tenant ('' for none), topic and key, as relay/publishBatch.ts keyOf spells it. */
export const streamKeyOf = (r: { tenant_id: string | null; topic: string; key: string }) =>
  `${r.tenant_id ?? ''}\u0000${r.topic}\u0000${r.key}`;

export function keyParts(k: string): { tenant: string; topic: string; key: string } {
  const [tenant, topic, key] = k.split('\u0000') as [string, string, string];
  return { tenant, topic, key };
}

/**
 * Which streamed rows the relay may publish at once, and which wait in the outbox table for a
 * sweep, so that a key's order holds whichever path its rows take.
 *
 * The table is the authority (a row leaves it only after the broker's ack); the stream is a
 * faster way to learn of new rows, and what it hands over is published only if the table
 * still has it (relay/wal/walMode.ts checks). A streamed row waits for the sweep when:
 * - its lane is held: from the moment this relay takes the lane (another relay may have left
 *   rows in it) or (re)starts its stream, until a sweep of the lane's rows found no more;
 * - its key is held: while the key is parked, and from the moment the stream left one of its
 *   rows to the table until a sweep of that key's rows found no more.
 * A held key's rows are published by the sweep in id order and its later streamed rows wait
 * behind them; the sweep reads only held lanes and held keys, never a row the stream has yet
 * to hand over, so commit order holds for the rest.
 */
export interface WalRouting {
  /** Lanes now owned with their tokens: a lane new to this relay, or taken again (a new token), is held. */
  lanesOwned(owned: ReadonlyMap<number, number>): void;
  /** The stream (re)started, a publish failed, or a transaction was too large to buffer: every owned lane is held. */
  holdAll(): void;
  /** Keys now parked (the relay parked one, or the sweep read them): held until released and drained. */
  parked(keys: Iterable<string>): void;
  /**
   * Splits taken rows: those to publish now, in order; the others stay in the table for the
   * sweep, and the WAL messages among them (rows of no table) must be written into it
   * (`toTable`, in order) before the slot is confirmed past them.
   */
  route(rows: readonly StreamRow[]): { now: StreamRow[]; toTable: StreamRow[] };
  /**
   * Transactions whose rows the stream left to the table since the last complete sweep. The
   * walsender may send a commit before the committing backend has left the proc array: for a
   * moment the row is not yet visible to a new snapshot. A sweep that ran then would miss it
   * and release its key while the row still waits; the relay sweeps only once these are
   * visible (relay/wal/walVisibility.ts).
   */
  tableXids(): number[];
  /** These transactions are visible to new snapshots: a sweep from now on sees their rows. */
  visible(xids: readonly number[]): void;
  /** The sweep must also wait for these (rows of theirs left to the table outside route()). */
  waitForXids(xids: Iterable<number>): void;
  /** The next sweep: the held lanes (at once), the held keys (periodically), or none. */
  sweepDue(now: number): { lanes: number[] } | { keys: string[] } | undefined;
  /**
   * A sweep claimed (`full`: a limit cut it) with these keys parked when it started. A lanes
   * sweep that got everything drained those lanes; a keys sweep, every held key not parked.
   */
  swept(
    o: { lanes: readonly number[] } | { keys: readonly string[] },
    r: { full: boolean; parkedBefore: ReadonlySet<string>; now: number },
  ): void;
  /** For stats and tests. */
  readonly held: { lanes: ReadonlySet<number>; keys: ReadonlySet<string> };
}

export function createWalRouting(o: { sweepEveryMs: number }): WalRouting {
  let owned = new Map<number, number>();
  const heldLanes = new Set<number>();
  const heldKeys = new Set<string>();
  const xids = new Set<number>();
  let lastKeySweep = Number.NEGATIVE_INFINITY;

  return {
    lanesOwned(next) {
      for (const [lane, token] of next) if (owned.get(lane) !== token) heldLanes.add(lane);
      for (const lane of heldLanes) if (!next.has(lane)) heldLanes.delete(lane);
      owned = new Map(next);
    },
    holdAll() {
      for (const lane of owned.keys()) heldLanes.add(lane);
    },
    parked(keys) {
      for (const k of keys) heldKeys.add(k);
    },
    route(rows) {
      const now: StreamRow[] = [];
      const toTable: StreamRow[] = [];
      for (const r of rows) {
        if (r.overflow) continue;
        // Its owner reads it from the table (a WAL message: once the relay wrote it there).
        const leave =
          !owned.has(r.lane) || heldLanes.has(r.lane) || (heldKeys.size > 0 && heldKeys.has(streamKeyOf(r)));
        if (!leave) now.push(r);
        else if (r.emitted) toTable.push(r);
        else if (owned.has(r.lane)) xids.add(r.xid); // the sweep reads it from the table, once visible
      }
      return { now, toTable };
    },
    tableXids() {
      return [...xids];
    },
    visible(seen) {
      for (const x of seen) xids.delete(x);
    },
    waitForXids(more) {
      for (const x of more) xids.add(x);
    },
    sweepDue(now) {
      const lanes = [...heldLanes].filter((l) => owned.has(l));
      if (lanes.length > 0) return { lanes };
      // Held keys wait for the periodic sweep: a parked key may stay parked for days, and a
      // sweep on every step would starve the stream (every other key would wait behind it).
      if (heldKeys.size > 0 && now - lastKeySweep >= o.sweepEveryMs) return { keys: [...heldKeys] };
      return undefined;
    },
    swept(what, { full, parkedBefore, now }) {
      // A keys sweep a limit cut (keys held after a crash, thousands of rows) goes on at once.
      if ('keys' in what && !full) lastKeySweep = now;
      if (full) return;
      if ('lanes' in what) {
        for (const l of what.lanes) heldLanes.delete(l);
        return;
      }
      for (const k of what.keys) if (!parkedBefore.has(k)) heldKeys.delete(k);
    },
    held: { lanes: heldLanes, keys: heldKeys },
  };
}
