import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import pg from 'pg';
import { databaseAddress, pingDatabase } from '../src/db/database.js';
import { isConfigurationSqlError, mapSqlError } from '../src/db/sqlstate.js';
import { CairnError, CairnErrorCodes, ConfigurationError } from '../src/errors.js';
import { isKafkaConfigurationError, isPoisonError } from '../src/kafka/classifyError.js';
import { silentLogger } from '../src/logger.js';
import { observations, withObservations } from '../src/metrics/observations.js';
import { parseOptions } from '../src/options.js';
import { LANE_COUNT } from '../src/outbox/lanes.js';
import { OUTBOX_CHANNEL } from '../src/outbox/outbox.js';
import { type Dependency, untilReachable } from '../src/startup/untilReachable.js';
import { RelayOptionsSchema } from './options.js';
import { isolatePoison, type PublishContext, publishWithRetry, toMessages } from './publishBatch.js';
import type { RelayObservation } from './publishSpan.js';
import { type Claim, type ClaimedRow, claimBatch } from './sql/claimBatch.js';
import { deleteFenced } from './sql/deleteFenced.js';
import {
  acquireLanes,
  forgetInstance,
  heartbeat,
  releaseLanes,
  renewLanes,
  replicationBarrier,
  seedLanes,
  synchronousReplication,
} from './sql/laneLeases.js';
import type { Relay, RelayOptions, RelayStats, RelayTestHooks } from './types.js';
import { createWalRouting, streamKeyOf } from './wal/walRouting.js';
import { lsnText } from './wal/walRows.js';
import { checkName, DEFAULT_PUBLICATION, DEFAULT_SLOT, prepareWal } from './wal/walSetup.js';
import { startWalStream, type WalStream } from './wal/walStream.js';
import { allVisible } from './wal/walVisibility.js';

export type { Relay, RelayOptions, RelayStats } from './types.js';

/**
 * Messages per claim. Measured on the 2-core dev machine (real broker, 40k x 200 B backlog,
 * one run, median of 3, CPU per message Node + Postgres + broker): 1,000 -> 60.6 us,
 * 2,500 -> 38.9, 5,000 -> 41.0. A claim's fixed costs (planning, round trips, one produce
 * request per partition) are paid per batch; past ~2,500 the gain is gone.
 */
const DEFAULT_BATCH_SIZE = 2500;
/**
 * Payload bytes per claim (1 MiB, the broker's default message.max.bytes): with large messages
 * the batch is cut by bytes before it is by count, so neither the relay's memory nor a produce
 * request grows with the payloads.
 */
const DEFAULT_MAX_BATCH_BYTES = 1024 * 1024;

class PublishFailed extends CairnError {
  constructor(cause: unknown) {
    super(CairnErrorCodes.PublishFailed, `publish failed: ${(cause as Error)?.message ?? String(cause)}`, {
      retriable: true,
      cause,
    });
  }
}

/**
 * Makes a relay; nothing connects until run(). Call stop() to end it (it holds the lanes,
 * the publisher and a LISTEN connection).
 */
export function createRelay(options: RelayOptions): Relay {
  return createRelayWithTestHooks(options, {});
}

/** Internal: `createRelay` with hooks at named points, for crash and interleaving tests. */
export function createRelayWithTestHooks(input: RelayOptions, hooks: RelayTestHooks): Relay {
  const options = parseOptions('relay options', RelayOptionsSchema, input);
  const instanceId = options.instanceId ?? `relay-${randomUUID()}`;
  const log = (options.logger ?? silentLogger).child({ component: 'relay', instance: instanceId });
  const db = options.db;
  const batchSize = options.batchSize ?? DEFAULT_BATCH_SIZE;
  const maxBatchBytes = options.maxBatchBytes ?? DEFAULT_MAX_BATCH_BYTES;
  const ttlMs = options.leaseTtlMs ?? 10_000;
  const maxIdleMs = options.maxIdleMs ?? 200;
  const renewEveryMs = Math.max(100, Math.floor(ttlMs / 3));
  const wal = options.wal && {
    connectionString: options.wal.connectionString,
    slot: checkName('wal.slot', options.wal.slot ?? DEFAULT_SLOT),
    publication: checkName('wal.publication', options.wal.publication ?? DEFAULT_PUBLICATION),
  };
  // The WAL mode: which streamed rows may be published now, which go through the table (wal/walRouting.ts).
  const routing = options.wal && createWalRouting({ sweepEveryMs: options.wal.sweepEveryMs ?? 1000 });
  const stats: RelayStats = {
    published: 0,
    batches: 0,
    retries: 0,
    parked: 0,
    lanesOwned: 0,
    lostLaneDeletes: 0,
    idleMs: 1,
    waitMs: { claim: 0, publish: 0, delete: 0, barrier: 0 },
    waitingFor: null,
  };
  const timed = async <T>(what: keyof RelayStats['waitMs'], p: Promise<T>): Promise<T> => {
    const t0 = performance.now();
    try {
      return await p;
    } finally {
      stats.waitMs[what] += performance.now() - t0;
    }
  };

  let owned = new Map<number, number>(); // lane -> fencing token
  let stopping = false;
  const stopWaiting = new AbortController();
  let running: Promise<void> | undefined;
  let wake: (() => void) | undefined;

  let barrierNeeded = false;

  async function rebalance(): Promise<void> {
    const live = await heartbeat(db, instanceId, ttlMs);
    barrierNeeded = options.replicationBarrier !== 'off' && (await synchronousReplication(db));
    owned = await renewLanes(db, instanceId, ttlMs);
    const share = Math.ceil(LANE_COUNT / live);
    if (owned.size > share) {
      const surplus = [...owned.keys()].slice(share);
      await releaseLanes(db, instanceId, surplus);
      for (const l of surplus) owned.delete(l);
      log.info({ released: surplus, live }, 'released lanes to rebalance');
    } else if (owned.size < share) {
      const got = await acquireLanes(db, instanceId, share - owned.size, ttlMs);
      for (const [l, t] of got) owned.set(l, t);
      if (got.size > 0) log.info({ lanes: [...got.keys()], live }, 'acquired lanes');
    }
    stats.lanesOwned = owned.size;
  }

  const publishing: PublishContext = {
    db,
    publisher: options.publisher,
    log,
    stats,
    publishRetries: options.publishRetries,
    hooks,
    observed: observations<RelayObservation>(),
  };

  // Pipelining: while batch N is published, batch N+1 is claimed (excluding N's rows), and
  // N's delete runs while N+1 is claimed and published. Measured on the 2-core dev machine
  // (bench/relay.ts, 1,000-message batches): the sequential claim/publish/delete loop drained
  // 18.5k msgs/s; see the README for the pipelined figure.
  let prefetch: Promise<Claim> | undefined;
  let deleting: Promise<void> | undefined;
  let deletingRows: Array<{ id: number; lane: number }> = [];

  // The WAL mode: published rows the delete did not find yet, tried again with the next delete
  // (and kept out of claims meanwhile). The walsender can hand over a commit a moment before it
  // is visible to other snapshots; deleting then finds nothing, and the sweep would send the
  // row a second time (measured: 9 of 1,100 rows at 1,000 msgs/s on a busy 2-core machine).
  let retryDeletes: Array<{ id: number; lane: number }> = [];
  const deleteAttempts = new Map<number, number>();

  async function finishDelete(): Promise<void> {
    const d = deleting;
    deleting = undefined;
    if (d) await timed('delete', d);
    deletingRows = [...retryDeletes];
  }

  /** Rows the delete missed that are worth another try; how many are given up on. */
  function retryLater(
    tried: ReadonlyArray<{ id: number; lane: number }>,
    deleted: readonly number[],
    fences: Map<number, number>,
  ): number {
    const gone = new Set(deleted);
    let givenUp = 0;
    for (const r of tried) {
      if (gone.has(r.id)) {
        deleteAttempts.delete(r.id);
        continue;
      }
      const attempts = (deleteAttempts.get(r.id) ?? 0) + 1;
      if (attempts < 3 && fences.has(r.lane)) {
        deleteAttempts.set(r.id, attempts);
        retryDeletes.push(r);
      } else {
        deleteAttempts.delete(r.id);
        givenUp++;
      }
    }
    return givenUp;
  }

  function startDelete(sent: ReadonlyArray<{ id: number; lane: number }>, fences: Map<number, number>): void {
    const tried = routing ? [...sent, ...retryDeletes] : [...sent];
    retryDeletes = [];
    deletingRows = tried;
    const ids = tried.map((r) => r.id);
    deleting = deleteFenced(db, { instanceId, ids, fences }).then(async (deleted) => {
      if (deleted.length === ids.length) {
        for (const id of deleted) deleteAttempts.delete(id);
        return;
      }
      const lost = routing ? retryLater(tried, deleted, fences) : ids.length - deleted.length;
      if (lost > 0) {
        // We lost a lane between claim and delete: the new owner republishes those rows (same message_id).
        stats.lostLaneDeletes += lost;
        log.warn(
          { published: ids.length, deleted: deleted.length },
          'lost a lane during a batch; rebalancing',
        );
        owned = await renewLanes(db, instanceId, ttlMs);
      }
    });
    // Awaited by finishDelete (which rethrows); meanwhile a failure must not be an unhandled
    // rejection, which ends the process while the loop waits on the broker.
    deleting.catch(() => {});
  }

  const vacuumEvery = options.vacuumEveryDeletes ?? 50_000;
  let deletedSinceVacuum = 0;
  let vacuuming = false;
  function maybeVacuum(deleted: number): void {
    deletedSinceVacuum += deleted;
    if (vacuumEvery <= 0 || vacuuming || deletedSinceVacuum < vacuumEvery) return;
    deletedSinceVacuum = 0;
    vacuuming = true;
    // In the background, on a pool connection: VACUUM cannot run inside a transaction, and it
    // only takes a lock that lets inserts, claims and deletes go on.
    void sql`VACUUM (SKIP_LOCKED) outbox`
      .execute(db)
      .catch((err: Error) => log.warn({ err: err.message }, 'VACUUM outbox failed; leaving it to autovacuum'))
      .finally(() => {
        vacuuming = false;
      });
  }

  const claim = (exclude: ReadonlyArray<{ id: number; lane: number }>) => {
    const lanes = [...owned.keys()];
    return claimBatch(db, {
      lanes,
      limit: batchSize,
      maxBytes: maxBatchBytes,
      exclude,
      ...(routing ? { maxIds: routing.sweepBounds(lanes) } : {}),
    });
  };

  async function nextRows(): Promise<Claim> {
    const p = prefetch;
    prefetch = undefined;
    if (p) {
      // Lanes may have moved since the prefetch was claimed. (Keys are parked only by the
      // owner of their lane, in isolatePoison, which drops the prefetch.)
      const c = await timed('claim', p);
      return { rows: c.rows.filter((r) => owned.has(r.lane)), full: c.full };
    }
    return timed('claim', claim(deletingRows));
  }

  /** Publishes one batch: its size, and whether a limit cut it (more may be waiting: no sleep). */
  async function processBatch(): Promise<{ n: number; full: boolean }> {
    const { rows, full } = await nextRows();
    if (rows.length === 0) {
      // Nothing (left) to publish: nothing waits for the broker either.
      if (stats.waitingFor === 'kafka') stats.waitingFor = null;
      await finishDelete();
      return { n: 0, full: false };
    }
    // (Not in the WAL mode: its sweep must know that a claim covered the lanes held at the time.)
    if (full && !routing) {
      prefetch = claim([...deletingRows, ...rows.map((r) => ({ id: r.id, lane: r.lane }))]);
      prefetch.catch(() => {}); // awaited (or dropped) later; never an unhandled rejection
    }
    await publishRows(rows);
    return { n: rows.length, full };
  }

  /** Publishes rows (claimed, or streamed) in order, parks what can never go, deletes what went. */
  async function publishRows(rows: readonly ClaimedRow[]): Promise<void> {
    const { ready, parkedAny } = await toMessages(publishing, rows);
    // The prefetch may hold later messages of a key parked now: claim afresh instead.
    if (parkedAny) prefetch = undefined;
    // With a synchronous standby, publish only what the standby is known to have.
    if (barrierNeeded) await timed('barrier', replicationBarrier(db, instanceId));
    let sentIds: number[];
    let failure: unknown;
    try {
      if (ready.length > 0) {
        await timed('publish', publishWithRetry(publishing, ready));
        // The broker acknowledges again: no longer waiting for it (see the loop's catch).
        if (stats.waitingFor === 'kafka') stats.waitingFor = null;
      }
      sentIds = ready.map((b) => b.row.id);
    } catch (err) {
      prefetch = undefined;
      if (!isPoisonError(err)) throw new PublishFailed(err);
      ({ sent: sentIds, failure } = await isolatePoison(publishing, ready));
    }
    await hooks.afterPublish?.(
      stats.batches + 1,
      rows.map((r) => r.message_id),
    );
    await finishDelete();
    const sentSet = new Set(sentIds);
    startDelete(
      rows.filter((r) => sentSet.has(r.id)).map((r) => ({ id: r.id, lane: r.lane })),
      new Map(owned),
    );
    stats.published += sentIds.length;
    maybeVacuum(sentIds.length);
    stats.batches++;
    if (failure !== undefined) throw new PublishFailed(failure);
    if (log.isLevelEnabled('trace')) {
      for (const r of rows) log.trace({ message_id: r.message_id, lane: r.lane }, 'published');
    }
  }

  // The WAL mode: rows come from the slot while it streams; the table is swept for what the
  // stream leaves to it (held lanes and keys, see wal/walRouting.ts) and read alone while the
  // stream is down or another relay streams the slot.
  let stream: WalStream | undefined;
  let walSchema = 'public';
  let streamRetryAt = 0;
  let streamed = 0;

  async function parkedKeys(): Promise<Set<string>> {
    const { rows } = await sql<{ tenant: string; topic: string; key: string }>`
      SELECT tenant, topic, key FROM outbox_parked_key`.execute(db);
    return new Set(rows.map((r) => streamKeyOf({ tenant_id: r.tenant, topic: r.topic, key: r.key })));
  }

  async function ensureStream(w: NonNullable<typeof wal>, r: NonNullable<typeof routing>): Promise<void> {
    if (stream && !stream.broken) return;
    if (stream) {
      await stream.stop();
      stream = undefined;
      r.holdAll();
    }
    if (Date.now() < streamRetryAt) return;
    streamRetryAt = Date.now() + 2000;
    try {
      const s = await startWalStream({ ...w, schema: walSchema, log });
      // Any id given out before now may be a row the stream delivers again (published, or
      // skipped by an operator, before a crash): those go through the table.
      const { rows } = await sql<{
        last: string;
      }>`SELECT (CASE WHEN is_called THEN last_value ELSE last_value - 1 END)::text AS last FROM outbox_id_seq`.execute(
        db,
      );
      r.streamStarted(Number(rows[0]!.last));
      stream = s;
      log.info({ slot: w.slot }, 'streaming the outbox from the WAL');
    } catch (err) {
      const code = (err as { code?: string }).code;
      // No REPLICATION right, or pg_hba refuses replication: the mode cannot work as configured.
      if (code === '42501' || code === '28000' || code === '28P01') {
        throw new ConfigurationError(`WAL relay: ${(err as Error).message}`, err);
      }
      log.warn(
        { err: (err as Error).message, slot: w.slot },
        'cannot stream the slot now (another relay streams it?); reading the outbox table meanwhile',
      );
    }
  }

  /** One step of the WAL mode: a sweep of the table when one is due, else the next streamed rows. */
  async function walStep(w: NonNullable<typeof wal>, r: NonNullable<typeof routing>) {
    await ensureStream(w, r);
    r.lanesOwned(owned);
    if (!stream) r.holdAll();
    const parkedSoFar = stats.parked;
    let step: { n: number; full: boolean };
    if (r.sweepDue(Date.now())) {
      // A row the stream left to the table may not be visible yet: sweep once it is (walVisibility.ts).
      if (!(await allVisible(db, r.tableXids()))) return { n: 0, full: false };
      const parkedBefore = await parkedKeys();
      r.parked(parkedBefore);
      step = await processBatch();
      r.swept({ full: step.full, parkedBefore, now: Date.now() });
    } else {
      const rows = stream!.take(batchSize, maxBatchBytes);
      if (rows.length === 0) {
        await finishDelete();
        if (retryDeletes.length > 0) startDelete([], new Map(owned));
        stream!.confirmIdle();
        return { n: 0, full: false };
      }
      streamed += rows.length;
      let end: bigint | undefined;
      for (const row of rows) if (row.endLsn !== undefined) end = row.endLsn;
      const publish = r.route(rows);
      if (publish.length > 0) await publishRows(publish);
      // Every row taken is now acknowledged or in the table: the slot may drop them.
      if (end !== undefined) stream!.confirm(end);
      step = { n: rows.length, full: rows.length >= batchSize };
    }
    // A key parked during the step: held until an operator releases it and a sweep drains it.
    if (stats.parked !== parkedSoFar) r.parked(await parkedKeys());
    return step;
  }

  // A notification that arrives while a batch runs is remembered, so the next sleep is skipped.
  let woken = false;
  function sleep(ms: number): Promise<void> {
    if (woken) {
      woken = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const t = setTimeout(resolve, ms);
      wake = () => {
        clearTimeout(t);
        wake = undefined;
        resolve();
      };
    });
  }

  let listener: pg.Client | undefined;
  async function listen(connectionString: string): Promise<void> {
    const client = new pg.Client({ connectionString, application_name: 'cairn-relay-listen' });
    client.on('notification', () => {
      if (wake) wake();
      else woken = true;
    });
    client.on('error', (err) => {
      log.warn({ err: err.message }, 'LISTEN connection lost; polling until it is back');
      listener = undefined;
      setTimeout(() => {
        if (!stopping) void listen(connectionString).catch(() => {});
      }, 1000).unref();
    });
    await client.connect();
    await client.query(`LISTEN ${OUTBOX_CHANNEL}`);
    listener = client;
  }

  /** Runs a start-up step until its dependency answers; stats.waitingFor says which one meanwhile. */
  function waitFor(
    dependency: Dependency,
    o: { address: string; isConfigurationError(err: unknown): boolean },
    step: () => Promise<void>,
  ): Promise<'reached' | 'stopped'> {
    return untilReachable(step, {
      dependency,
      ...o,
      logger: log,
      signal: stopWaiting.signal,
      onWaiting: (w) => {
        stats.waitingFor = w ? dependency : null;
      },
    });
  }

  async function loop(): Promise<void> {
    const database = { address: databaseAddress(db), isConfigurationError: isConfigurationSqlError };
    if ((await waitFor('postgres', database, () => pingDatabase(db))) === 'stopped') return;
    await seedLanes(db).catch((err: unknown) => {
      const mapped = mapSqlError(err); // an unmigrated database: "run cairn migrate"
      if (!(mapped instanceof ConfigurationError)) throw mapped;
      throw new ConfigurationError(`${database.address}: ${mapped.message}`, err);
    });
    if (wal) walSchema = await prepareWal(db, wal);
    if (options.wakeOnNotify) {
      await listen(options.wakeOnNotify).catch((err: Error) =>
        log.warn({ err: err.message }, 'LISTEN failed; polling only'),
      );
    }
    const broker = { address: options.publisher.address, isConfigurationError: isKafkaConfigurationError };
    const connected = await waitFor('kafka', broker, () =>
      options.publisher.connect().catch(async (err: unknown) => {
        await options.publisher.disconnect().catch(() => {});
        throw err;
      }),
    );
    if (connected === 'stopped') {
      await listener?.end().catch(() => {});
      return;
    }
    let lastRebalance = 0;
    let idle = 1;
    try {
      while (!stopping) {
        try {
          if (Date.now() - lastRebalance >= renewEveryMs) {
            await rebalance();
            lastRebalance = Date.now();
          }
          // Without lanes nothing waits for the broker here: say so (the metric would alert forever).
          if (owned.size === 0 && stats.waitingFor === 'kafka') stats.waitingFor = null;
          const { n, full } =
            owned.size === 0
              ? { n: 0, full: false }
              : wal && routing
                ? await walStep(wal, routing)
                : await processBatch();
          if (full) {
            idle = 1;
            stats.idleMs = 1;
            continue;
          }
          // Never sleep past a lane renewal: the leases would expire under a sleeping relay.
          idle = n > 0 ? 1 : Math.min(maxIdleMs, renewEveryMs, idle * 2);
          stats.idleMs = idle;
          if (stream && n === 0) await stream.wait(idle);
          else await sleep(n > 0 ? 0 : idle);
        } catch (err) {
          if (routing && err instanceof ConfigurationError) throw err; // the WAL mode as configured cannot work
          prefetch = undefined;
          routing?.holdAll(); // what was taken from the stream is in the table: the sweep sends it
          await finishDelete().catch(() => {});
          log.error({ err: (err as Error).message }, 'relay iteration failed; retrying');
          await sleep(Math.min(1000, maxIdleMs * 2));
          if (err instanceof PublishFailed) {
            // Rows are held until the broker acknowledges them: say so where an operator looks
            // (/readyz answers 503, cairn_relay_waiting_for 1) until a batch goes through.
            stats.waitingFor = 'kafka';
            // A kafkajs producer can stay stuck after a broker restart (kafkajs issues 1167,
            // 1513): start a fresh one (a new producer id) before the batch is tried again.
            await options.publisher.disconnect().catch(() => {});
            await options.publisher
              .connect()
              .catch((e: Error) => log.warn({ err: e.message }, 'reconnect failed'));
          }
        }
      }
    } finally {
      await finishDelete().catch(() => {});
      await stream?.stop().catch(() => {});
      stream = undefined;
      await listener?.end().catch(() => {});
      await releaseLanes(db, instanceId, [...owned.keys()]).catch(() => {});
      await forgetInstance(db, instanceId, ttlMs).catch(() => {});
      await options.publisher.disconnect().catch(() => {});
      owned = new Map();
      stats.lanesOwned = 0;
    }
  }

  const relay: Relay = {
    instanceId,
    run() {
      running ??= loop();
      return running;
    },
    async stop() {
      stopping = true;
      stopWaiting.abort();
      wake?.();
      await running;
    },
    stats: () => ({
      ...stats,
      waitMs: { ...stats.waitMs },
      ...(routing && {
        wal: {
          slot: wal!.slot,
          streaming: stream !== undefined && !stream.broken,
          streamed,
          confirmedLsn: stream && stream.confirmed > 0n ? lsnText(stream.confirmed) : null,
          heldLanes: routing.held.lanes.size,
          heldKeys: routing.held.keys.size,
        },
      }),
    }),
  };
  return withObservations(relay, publishing.observed);
}
