import { sql } from 'kysely';
import type { Db } from '../../src/db/database.js';
import { ConfigurationError } from '../../src/errors.js';
import type { Logger } from '../../src/logger.js';
import type { DeletePipeline } from '../deletePipeline.js';
import { type Claim, type ClaimedRow, claimBatch } from '../sql/claimBatch.js';
import { claimKeys } from '../sql/claimKeys.js';
import type { RelayStats, RelayWalOptions } from '../types.js';
import { presentRows } from './walPresent.js';
import { createWalRouting, keyParts, streamKeyOf } from './walRouting.js';
import { lsnAtMost, lsnOf, lsnText, type StreamRow } from './walRows.js';
import {
  checkName,
  DEFAULT_PUBLICATION,
  DEFAULT_SLOT,
  forgetMessageReader,
  prepareWal,
  registeredSlotLost,
  registerMessageReader,
} from './walSetup.js';
import { startWalStream, type WalStream } from './walStream.js';
import { writeToTable } from './walToTable.js';
import { allVisible } from './walVisibility.js';

/**
 * The relay's WAL mode: rows come from the slot while this relay streams it; the table is swept
 * (the polling claim) for what the stream leaves to it (held lanes and keys, walRouting.ts) and
 * read alone while the stream is down or another relay streams the slot.
 */
export interface WalMode {
  /** Checks the server and creates the publication and slot when missing (walSetup.ts). */
  prepare(): Promise<void>;
  /** One step: a sweep of the table when one is due, else the next streamed rows. */
  step(): Promise<{ n: number; full: boolean }>;
  /** Waits for streamed rows (up to `ms`); undefined when not streaming (the caller sleeps). */
  wait(ms: number): Promise<void> | undefined;
  /** A step failed: what was taken from the stream is in the table, every lane goes through it. */
  holdAll(): void;
  stop(): Promise<void>;
  stats(): NonNullable<RelayStats['wal']>;
}

/**
 * The slot can never be streamed again as it is: it was dropped, its publication was dropped
 * and made again (its decoding fails at the gap for good), or it was invalidated
 * (max_slot_wal_keep_size).
 */
function unstreamable(e: { code?: string; message: string }): boolean {
  return (
    e.code === '42704' ||
    /can no longer get changes|publication .* does not exist|replication slot .* does not exist/.test(
      e.message,
    )
  );
}

/** How long a streamed commit may stay invisible to new snapshots before its rows go through the table. */
const VISIBLE_WITHIN_MS = 2000;

export function createWalMode(o: {
  db: Db;
  log: Logger;
  options: RelayWalOptions;
  batchSize: number;
  maxBatchBytes: number;
  stats: RelayStats;
  /** The lanes this relay owns now, with their tokens. */
  owned(): ReadonlyMap<number, number>;
  /** Waits on a claim, counted in stats.waitMs.claim. */
  timedClaim(p: Promise<Claim>): Promise<Claim>;
  /** Publishes rows in order, parks what can never go, deletes what went. */
  publish(rows: readonly ClaimedRow[]): Promise<void>;
  deletes: DeletePipeline;
}): WalMode {
  const { db, log } = o;
  const slot = checkName('wal.slot', o.options.slot ?? DEFAULT_SLOT);
  const publication = checkName('wal.publication', o.options.publication ?? DEFAULT_PUBLICATION);
  const routing = createWalRouting({ sweepEveryMs: o.options.sweepEveryMs ?? 1000 });
  let stream: WalStream | undefined;
  let schema = 'public';
  let messageSecret: Buffer | undefined;
  let messagesMaybeLost = 0;
  let forgedBefore = 0;
  /** After a stream start: WAL messages up to here may have been moved before (walToTable.ts). */
  let redeliverUpTo = 0n;
  /** The slot's registration when this relay's stream started (a newer one: another relay made the slot again). */
  let registeredAtStart: string | null = null;
  let retryAt = 0;
  let streamed = 0;
  let movedToTable = 0;

  async function parkedKeys(): Promise<Set<string>> {
    const { rows } = await sql<{ tenant: string; topic: string; key: string }>`
      SELECT tenant, topic, key FROM outbox_parked_key`.execute(db);
    return new Set(rows.map((r) => streamKeyOf({ tenant_id: r.tenant, topic: r.topic, key: r.key })));
  }

  /**
   * The slot was a reader of WAL messages and is gone or unusable: what it held is lost to any
   * new slot. Writers are refused from now on, until the new slot is made and registered.
   */
  async function slotLost(why: string, o: { dropping?: boolean } = {}): Promise<void> {
    // About to be dropped (it can no longer be streamed: a publication dropped and made again),
    // a registered slot loses what it holds as surely as one found gone.
    if (!(await registeredSlotLost(db, slot, o))) return;
    await forgetMessageReader(db, slot);
    messagesMaybeLost++;
    log.error(
      { slot, why },
      'the replication slot that read outbox WAL messages is lost: messages committed and not yet acknowledged by the broker ' +
        'cannot be read by a new slot (a promotion on Postgres 15/16, an invalidated or dropped slot); writers are refused until it is made again',
    );
  }

  /**
   * Makes the slot again: it does not exist (made anew, nothing dropped), or it exists and can no
   * longer be streamed (dropped first: the table covers the gap for rows; not for WAL messages).
   * Several relays may find it so at once: a slot another relay made and registered since this
   * one's stream started is left alone (its registration is newer).
   */
  async function remakeSlot(why: string, o: { missing?: boolean } = {}): Promise<void> {
    log.warn(
      { slot, why },
      'the replication slot cannot be streamed; making it again (the table covers the gap)',
    );
    if (o.missing) await slotLost(why);
    else {
      // Its walsender may take a moment to end after the stream broke.
      for (let i = 0; i < 20; i++) {
        const { rows } = await sql<{ active: boolean; registered: string | null }>`
          SELECT s.active, (SELECT w.registered_at::text FROM outbox_wal_reader w WHERE w.slot_name = s.slot_name) AS registered
            FROM pg_replication_slots s WHERE s.slot_name = ${slot}`.execute(db);
        if (rows.length === 0) break;
        if (rows[0]!.registered !== registeredAtStart) return; // another relay made it again
        if (!rows[0]!.active) {
          await slotLost(why, { dropping: true });
          await sql`SELECT pg_drop_replication_slot(${slot})`.execute(db).catch(() => {});
          break;
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    try {
      await prepareWal(db, { slot, publication });
      retryAt = 0;
    } catch (e) {
      log.warn({ err: (e as Error).message, slot }, 'could not make the replication slot');
    }
  }

  async function ensureStream(): Promise<void> {
    if (stream && !stream.broken) return;
    routing.holdAll();
    if (stream) {
      const why = stream.broken;
      if (why instanceof ConfigurationError) throw why;
      await stream.stop();
      forgedBefore += stream.forged;
      stream = undefined;
      if (why && unstreamable(why)) return remakeSlot(why.message);
    }
    if (performance.now() < retryAt) return;
    retryAt = performance.now() + 2000;
    try {
      const { rows } = await sql<{ lsn: string | null }>`
        SELECT confirmed_flush_lsn::text AS lsn FROM pg_replication_slots WHERE slot_name = ${slot}`.execute(
        db,
      );
      if (rows.length === 0) {
        return remakeSlot('it does not exist (dropped, or a server that never had it)', { missing: true });
      }
      // Registered once the slot exists (again at each start: a promoted server has another
      // timeline, writers wait for this), and what it may deliver again read before it streams.
      messageSecret = await registerMessageReader(db, slot, log);
      const reader = await sql<{ moved: string | null; registered: string | null }>`
        SELECT (SELECT max(moved_lsn)::text FROM outbox_wal_reader) AS moved,
               (SELECT registered_at::text FROM outbox_wal_reader WHERE slot_name = ${slot}) AS registered`.execute(
        db,
      );
      redeliverUpTo = lsnOf(reader.rows[0]?.moved) ?? 0n;
      registeredAtStart = reader.rows[0]?.registered ?? null;
      stream = await startWalStream({
        connectionString: o.options.connectionString,
        slot,
        publication,
        schema,
        log,
        ...(messageSecret !== undefined && { messageSecret }),
        ...(rows[0]!.lsn ? { confirmedFlush: lsnOf(rows[0]!.lsn)! } : {}),
      });
      routing.holdAll(); // rows may have been left in the table meanwhile: read it first
      log.info({ slot }, 'streaming the outbox from the WAL');
    } catch (err) {
      const e = err as { code?: string; message: string };
      // No REPLICATION right, or pg_hba refuses replication: the mode cannot work as configured.
      if (e.code === '42501' || e.code === '28000' || e.code === '28P01') {
        throw new ConfigurationError(`WAL relay: ${e.message}`, err);
      }
      if (unstreamable(e)) return remakeSlot(e.message);
      log.warn({ err: e.message, slot }, 'cannot stream the slot now; reading the outbox table meanwhile');
    }
  }

  async function sweep(
    what: { lanes: number[] } | { keys: string[] },
  ): Promise<{ n: number; full: boolean }> {
    // A row the stream left to the table may not be visible yet: sweep once it is (walVisibility.ts).
    const xids = routing.tableXids();
    if (!(await allVisible(db, xids))) {
      await new Promise((r) => setTimeout(r, 2)); // not the stream's wait: it returns at once while rows are buffered
      return { n: 0, full: false };
    }
    routing.visible(xids);
    const parkedBefore = await parkedKeys();
    routing.parked(parkedBefore);
    const exclude = o.deletes.inFlight;
    const claim = await o.timedClaim(
      'lanes' in what
        ? claimBatch(db, { lanes: what.lanes, limit: o.batchSize, maxBytes: o.maxBatchBytes, exclude })
        : claimKeys(db, {
            lanes: [...o.owned().keys()],
            keys: what.keys.map(keyParts),
            limit: o.batchSize,
            maxBytes: o.maxBatchBytes,
            exclude,
          }),
    );
    if (claim.rows.length > 0) await o.publish(claim.rows);
    else await o.deletes.finish();
    routing.swept(what, { full: claim.full, parkedBefore, now: performance.now() });
    return { n: claim.rows.length, full: claim.full };
  }

  /**
   * The taken rows the table still has, once their transactions are visible, and every WAL
   * message (no table has it; only the slot); undefined: not visible in time.
   */
  async function stillInTable(taken: StreamRow[]): Promise<StreamRow[] | undefined> {
    const rows = taken.filter((r) => !r.emitted);
    if (rows.length === 0) return taken; // WAL messages only: nothing to ask the table
    const xids = [...new Set(rows.map((r) => r.xid))];
    const until = performance.now() + VISIBLE_WITHIN_MS;
    for (;;) {
      const { visible, present } = await presentRows(
        db,
        rows.map((r) => r.id),
        xids,
      );
      if (visible) return taken.filter((r) => r.emitted || present.has(r.id));
      if (performance.now() > until) return undefined;
      await new Promise((r) => setTimeout(r, 2));
    }
  }

  /**
   * The next streamed rows. Should a step fail after WAL messages were taken and before the
   * slot was confirmed past them, the stream starts again from the slot's position: the slot
   * is their only copy (a table row's copy is the table).
   */
  async function fromStream(s: WalStream): Promise<{ n: number; full: boolean }> {
    const rows = s.take(o.batchSize, o.maxBatchBytes);
    try {
      return await fromTaken(s, rows);
    } catch (err) {
      if (rows.some((r) => r.emitted)) {
        log.warn({ err: (err as Error).message }, 'reading the slot again from its confirmed position');
        await s.stop();
        retryAt = 0;
      }
      throw err;
    }
  }

  /**
   * The slot delivers again what it delivered before a crash (its position is saved at
   * checkpoints). WAL messages up to the last one moved into the table may have been moved,
   * and skipped since by an operator: their keys wait for the table (writeToTable drops what
   * was skipped), so nothing skipped comes back and a key's order holds. Until the next stream
   * start; a message written before the bound in a long transaction goes through the table too.
   */
  function holdRedelivered(rows: readonly StreamRow[]): void {
    // Every message of the stream is compared: transactions arrive in commit order, and a
    // message's own position is where it was written, so a transaction committed later can
    // hold a message from before the bound (two writers overlapping).
    const keys: string[] = [];
    for (const r of rows) {
      if (r.emitted && r.walLsn !== undefined && lsnAtMost(r.walLsn, redeliverUpTo))
        keys.push(streamKeyOf(r));
    }
    if (keys.length > 0) routing.parked(keys);
  }

  async function fromTaken(s: WalStream, rows: StreamRow[]): Promise<{ n: number; full: boolean }> {
    if (rows.length === 0) {
      await o.deletes.finish();
      if (o.deletes.retrying) o.deletes.start([], new Map(o.owned()));
      s.confirmIdle();
      return { n: 0, full: false };
    }
    streamed += rows.filter((r) => !r.overflow).length;
    let end: bigint | undefined;
    for (const row of rows) if (row.endLsn !== undefined) end = row.endLsn;
    // A transaction too large to buffer: its rows are in the table, read every lane from there
    // (once its commit is visible).
    const overflow = rows.filter((r) => r.overflow);
    if (overflow.length > 0) {
      routing.holdAll();
      routing.waitForXids(overflow.map((r) => r.xid));
    }
    // A row this relay is deleting (sent by its sweep a moment ago) is still in the table until
    // the delete commits: it must not go a second time.
    const deleting = new Set(o.deletes.inFlight.map((r) => r.id));
    if (redeliverUpTo > 0n) holdRedelivered(rows);
    const { now, toTable } = routing.route(rows);
    if (toTable.length > 0) {
      await writeToTable(db, toTable);
      movedToTable += toTable.length;
    }
    const routed = deleting.size > 0 ? now.filter((r) => !deleting.has(r.id)) : now;
    const publish = routed.length > 0 ? await stillInTable(routed) : [];
    if (publish === undefined) {
      // Not visible in time (a synchronous standby far behind): the sweep reads them, once visible.
      routing.holdAll();
      routing.waitForXids(routed.map((r) => r.xid));
      await writeToTable(db, routed);
    } else if (publish.length > 0) await o.publish(publish);
    // Every row taken is now acknowledged, in the table, or gone from it: the slot may drop them.
    if (end !== undefined) s.confirm(end);
    return { n: rows.length, full: rows.length >= o.batchSize };
  }

  return {
    async prepare() {
      await slotLost('found at start');
      schema = await prepareWal(db, { slot, publication });
      messageSecret = await registerMessageReader(db, slot, log);
    },
    async step() {
      await ensureStream();
      routing.lanesOwned(o.owned());
      const parkedSoFar = o.stats.parked;
      const due = routing.sweepDue(performance.now());
      const step = due ? await sweep(due) : stream ? await fromStream(stream) : { n: 0, full: false };
      // A key parked during the step: held until an operator releases it and a sweep drains it.
      if (o.stats.parked !== parkedSoFar) routing.parked(await parkedKeys());
      return step;
    },
    wait(ms) {
      return stream && !stream.broken ? stream.wait(ms) : undefined;
    },
    holdAll() {
      routing.holdAll();
    },
    async stop() {
      await stream?.stop().catch(() => {});
      forgedBefore += stream?.forged ?? 0; // counted on: a stopped stream's count is not lost
      stream = undefined;
    },
    stats() {
      return {
        slot,
        streaming: stream !== undefined && !stream.broken,
        streamed,
        confirmedLsn: stream && stream.confirmed > 0n ? lsnText(stream.confirmed) : null,
        heldLanes: routing.held.lanes.size,
        heldKeys: routing.held.keys.size,
        readsMessages: messageSecret !== undefined,
        forgedMessages: forgedBefore + (stream?.forged ?? 0),
        movedToTable,
        messagesMaybeLost,
      };
    },
  };
}
