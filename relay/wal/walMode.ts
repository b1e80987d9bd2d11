import { sql } from 'kysely';
import type { Db } from '../../src/db/database.js';
import { ConfigurationError } from '../../src/errors.js';
import type { Logger } from '../../src/logger.js';
import type { DeletePipeline } from '../deletePipeline.js';
import type { ClaimedRow } from '../sql/claimBatch.js';
import type { RelayStats, RelayWalOptions } from '../types.js';
import { createWalRouting, streamKeyOf } from './walRouting.js';
import { lsnText } from './walRows.js';
import { checkName, DEFAULT_PUBLICATION, DEFAULT_SLOT, prepareWal } from './walSetup.js';
import { startWalStream, type WalStream } from './walStream.js';
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
  /** The sweep's claim bounds for these lanes. */
  sweepBounds(lanes: readonly number[]): number[];
  stop(): Promise<void>;
  stats(): NonNullable<RelayStats['wal']>;
}

export function createWalMode(o: {
  db: Db;
  log: Logger;
  options: RelayWalOptions;
  batchSize: number;
  maxBatchBytes: number;
  stats: RelayStats;
  /** The lanes this relay owns now, with their tokens. */
  owned(): Map<number, number>;
  /** One batch of the polling claim over the owned lanes (bounded by sweepBounds). */
  sweep(): Promise<{ n: number; full: boolean }>;
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
  let retryAt = 0;
  let streamed = 0;

  async function parkedKeys(): Promise<Set<string>> {
    const { rows } = await sql<{ tenant: string; topic: string; key: string }>`
      SELECT tenant, topic, key FROM outbox_parked_key`.execute(db);
    return new Set(rows.map((r) => streamKeyOf({ tenant_id: r.tenant, topic: r.topic, key: r.key })));
  }

  async function ensureStream(): Promise<void> {
    if (stream && !stream.broken) return;
    if (stream) {
      await stream.stop();
      stream = undefined;
      routing.holdAll();
    }
    if (Date.now() < retryAt) return;
    retryAt = Date.now() + 2000;
    try {
      const s = await startWalStream({
        connectionString: o.options.connectionString,
        slot,
        publication,
        schema,
        log,
      });
      // Any id given out before now may be a row the stream delivers again (published, or
      // skipped by an operator, before a crash): those go through the table.
      const { rows } = await sql<{ last: string }>`
        SELECT (CASE WHEN is_called THEN last_value ELSE last_value - 1 END)::text AS last FROM outbox_id_seq`.execute(
        db,
      );
      routing.streamStarted(Number(rows[0]!.last));
      stream = s;
      log.info({ slot }, 'streaming the outbox from the WAL');
    } catch (err) {
      const code = (err as { code?: string }).code;
      // No REPLICATION right, or pg_hba refuses replication: the mode cannot work as configured.
      if (code === '42501' || code === '28000' || code === '28P01') {
        throw new ConfigurationError(`WAL relay: ${(err as Error).message}`, err);
      }
      if (code === '42704') {
        // The slot was dropped under us (by hand, or a failover to a server without it): make a
        // new one. Nothing is lost: the lanes are held, so the table is read first.
        log.warn({ slot }, 'the replication slot is gone; creating it again');
        await prepareWal(db, { slot, publication }).catch((e: Error) =>
          log.warn({ err: e.message, slot }, 'could not create the replication slot'),
        );
        retryAt = 0;
        return;
      }
      log.warn(
        { err: (err as Error).message, slot },
        'cannot stream the slot now (another relay streams it?); reading the outbox table meanwhile',
      );
    }
  }

  async function sweep(): Promise<{ n: number; full: boolean }> {
    // A row the stream left to the table may not be visible yet: sweep once it is (walVisibility.ts).
    if (!(await allVisible(db, routing.tableXids()))) return { n: 0, full: false };
    const parkedBefore = await parkedKeys();
    routing.parked(parkedBefore);
    const step = await o.sweep();
    routing.swept({ full: step.full, parkedBefore, now: Date.now() });
    return step;
  }

  async function fromStream(s: WalStream): Promise<{ n: number; full: boolean }> {
    const rows = s.take(o.batchSize, o.maxBatchBytes);
    if (rows.length === 0) {
      await o.deletes.finish();
      if (o.deletes.retrying) o.deletes.start([], new Map(o.owned()));
      s.confirmIdle();
      return { n: 0, full: false };
    }
    streamed += rows.length;
    let end: bigint | undefined;
    for (const row of rows) if (row.endLsn !== undefined) end = row.endLsn;
    const publish = routing.route(rows);
    if (publish.length > 0) await o.publish(publish);
    // Every row taken is now acknowledged or in the table: the slot may drop them.
    if (end !== undefined) s.confirm(end);
    return { n: rows.length, full: rows.length >= o.batchSize };
  }

  return {
    async prepare() {
      schema = await prepareWal(db, { slot, publication });
    },
    async step() {
      await ensureStream();
      routing.lanesOwned(o.owned());
      if (!stream) routing.holdAll();
      const parkedSoFar = o.stats.parked;
      const step = routing.sweepDue(Date.now()) || !stream ? await sweep() : await fromStream(stream);
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
    sweepBounds(lanes) {
      return routing.sweepBounds(lanes);
    },
    async stop() {
      await stream?.stop().catch(() => {});
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
      };
    },
  };
}
