import { randomUUID } from 'node:crypto';
import { databaseAddress, pingDatabase } from '../src/db/database.js';
import { isConfigurationSqlError, isDatabaseOutage, mapSqlError } from '../src/db/sqlstate.js';
import { ConfigurationError } from '../src/errors.js';
import { isKafkaConfigurationError } from '../src/kafka/classifyError.js';
import { silentLogger } from '../src/logger.js';
import { observations, withObservations } from '../src/metrics/observations.js';
import { parseOptions } from '../src/options.js';
import { type Dependency, untilReachable } from '../src/startup/untilReachable.js';
import { createDeletePipeline } from './deletePipeline.js';
import { createHeldLanes } from './heldLanes.js';
import { isolate } from './isolate.js';
import { DEFAULT_BATCH_SIZE, DEFAULT_MAX_BATCH_BYTES, RelayOptionsSchema } from './options.js';
import {
  isLaneError,
  type PublishContext,
  PublishFailed,
  publishWithRetry,
  type Ready,
  toMessages,
} from './publishBatch.js';
import type { RelayObservation } from './publishSpan.js';
import { type Claim, type ClaimedRow, claimBatch } from './sql/claimBatch.js';
import {
  forgetInstance,
  releaseLanes,
  replicationBarrier,
  seedLanes,
  stepAsideIfOthersLive,
  synchronousReplication,
} from './sql/laneLeases.js';
import { stepAsidePolicy } from './stepAside.js';
import { newRelayStats, type Relay, type RelayOptions, type RelayTestHooks, waitTimer } from './types.js';
import { createVacuumer } from './vacuum.js';
import { createWakeup } from './wakeup.js';
import { createWalMode } from './wal/walMode.js';
import { writeToTable } from './wal/walToTable.js';

export type { Relay, RelayOptions, RelayStats } from './types.js';

/** A claim and the lane tokens it was made under (lane -> fencing token). */
type FencedClaim = Claim & { fences: ReadonlyMap<number, number> };

/** Errors at start that are no outage (the lanes or the slot refused): they end the wait. */
const refusedAtStart = new WeakSet<object>();

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
  const stats = newRelayStats();
  const timed = waitTimer(stats);

  const lanes = createHeldLanes({ db, instanceId, ttlMs, renewEveryMs, log, stats });
  let stopping = false;
  const stopWaiting = new AbortController();
  let running: Promise<void> | undefined;

  let barrierNeeded = false;
  const aside = stepAsidePolicy(ttlMs);

  /** Gives the lanes and WAL stream to the other live relays (relay/stepAside.ts); unsent rows stay in the table or slot. */
  async function stepAside(): Promise<void> {
    prefetch = undefined;
    await deletes.finish().catch(() => {});
    const given = await stepAsideIfOthersLive(db, instanceId, ttlMs);
    if (given === undefined) return; // alone: giving the lanes up helps nobody
    await walMode?.stop();
    lanes.drop();
    Object.assign(stats, { steppedAside: stats.steppedAside + 1, waitingFor: null });
    log.warn(
      { lanes: given, for_ms: aside.stepped() },
      'the broker could not be reached for twice the lease TTL while other relays are live: their turn with these lanes',
    );
  }

  async function rebalance(): Promise<void> {
    barrierNeeded = options.replicationBarrier !== 'off' && (await synchronousReplication(db));
    await lanes.rebalance();
  }

  const publishing: PublishContext = {
    db,
    instanceId,
    fenceOf: (lane) => lanes.owned.get(lane),
    keepLanes: () => lanes.keep(),
    publisher: options.publisher,
    admin: options.admin,
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
  let prefetch: Promise<FencedClaim> | undefined;
  const deletes = createDeletePipeline({
    db,
    instanceId,
    log,
    stats,
    retryMissed: options.wal !== undefined,
    timed: (p) => timed('delete', p),
    onLostLane: () => lanes.renew(),
  });

  const maybeVacuum = createVacuumer({ db, log, every: options.vacuumEveryDeletes ?? 50_000 });

  /** A claim, with the lane tokens it was made under. */
  const claim = (exclude: ReadonlyArray<{ id: number; lane: number }>): Promise<FencedClaim> => {
    const fences = new Map(lanes.owned);
    stats.claims++;
    return claimBatch(db, {
      lanes: [...fences.keys()],
      limit: batchSize,
      maxBytes: maxBatchBytes,
      exclude,
    }).then((c) => ({ ...c, fences }));
  };

  async function nextRows(): Promise<Claim> {
    const p = prefetch;
    prefetch = undefined;
    const c = await timed('claim', p ?? claim(deletes.inFlight));
    // Lanes may have moved since the rows were claimed (a prefetch outlives a rebalance): only
    // rows of lanes still held under the token they were claimed under go on. A lane lost and
    // taken back meanwhile has a new token, and its rows were the other owner's to send. (Keys
    // are parked only by the owner of their lane, in isolate, which drops the prefetch.)
    return { rows: c.rows.filter((r) => lanes.owned.get(r.lane) === c.fences.get(r.lane)), full: c.full };
  }

  /** Publishes one batch: its size, and whether a limit cut it (more may be waiting: no sleep). */
  async function processBatch(): Promise<{ n: number; full: boolean }> {
    const { rows, full } = await nextRows();
    if (rows.length === 0) {
      // Nothing (left) to publish: nothing waits for the broker either.
      if (stats.waitingFor === 'kafka') stats.waitingFor = null;
      await deletes.finish();
      return { n: 0, full: false };
    }
    if (full) {
      prefetch = claim([...deletes.inFlight, ...rows]);
      prefetch.catch(() => {}); // awaited (or dropped) later; never an unhandled rejection
    }
    await publishRows(rows);
    return { n: rows.length, full };
  }

  /** Publishes rows (claimed, or streamed) in order, parks what can never go, deletes what went. */
  async function publishRows(rows: readonly ClaimedRow[]): Promise<void> {
    const { ready: encoded, parkedAny } = await toMessages(publishing, rows);
    // The prefetch may hold later messages of a key parked now: claim afresh instead.
    if (parkedAny) prefetch = undefined;
    // With a synchronous standby, publish only what the standby is known to have.
    if (barrierNeeded) await timed('barrier', replicationBarrier(db, instanceId));
    // A park or the barrier may have outlasted the lease: a lane lost meanwhile is its new
    // owner's to send (review). Its rows stay (WAL messages go to the table, below).
    await lanes.keep();
    const held = (b: Ready) => lanes.owned.has(b.row.lane);
    const ready = encoded.every(held) ? encoded : encoded.filter(held);
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
      if (isLaneError(err)) throw err;
      const isolated = await isolate(publishing, ready, err); // a refusal, or a topic the broker lacks
      if (!isolated) throw new PublishFailed(err);
      ({ sent: sentIds, failure } = isolated);
    }
    await hooks.afterPublish?.(
      stats.batches + 1,
      rows.map((r) => r.message_id),
    );
    await deletes.finish();
    // Usually every row went: no set of ids to filter by then.
    let sent: readonly ClaimedRow[] = rows;
    if (sentIds.length !== rows.length) {
      const sentSet = new Set(sentIds);
      sent = rows.filter((r) => sentSet.has(r.id));
      // WAL messages behind a key parked now wait in the table, as its rows do (the WAL mode
      // confirms the slot past them next). After a failure the stream reads them again instead.
      if (failure === undefined)
        await writeToTable(
          db,
          rows.filter((r) => r.emitted && !sentSet.has(r.id)),
        );
    }
    if (sent.some((r) => r.emitted)) sent = sent.filter((r) => !r.emitted); // no row to delete
    deletes.start(sent, new Map(lanes.owned));
    stats.published += sentIds.length;
    maybeVacuum(sentIds.length);
    stats.batches++;
    // A lane lost in an isolation is no broker's failure: the loop takes its share again.
    if (failure !== undefined) throw isLaneError(failure) ? failure : new PublishFailed(failure);
    if (log.isLevelEnabled('trace')) {
      for (const r of rows) log.trace({ message_id: r.message_id, lane: r.lane }, 'published');
    }
  }

  const walMode =
    options.wal &&
    createWalMode({
      db,
      log,
      options: options.wal,
      batchSize,
      maxBatchBytes,
      stats,
      owned: () => lanes.owned,
      timedClaim: (p) => timed('claim', p),
      publish: publishRows,
      deletes,
    });

  const wakeup = createWakeup({ log, stopping: () => stopping, maxDeafMs: maxIdleMs });
  const sleep = wakeup.sleep;

  /** Runs a start-up step until its dependency answers; stats.waitingFor says which one meanwhile. */
  function waitFor(
    dependency: Dependency,
    o: { address: string; isConfigurationError(err: unknown): boolean; isFinal?(err: unknown): boolean },
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
    const database = {
      address: databaseAddress(db),
      isConfigurationError: isConfigurationSqlError,
      // Anything at start but an outage (the lanes or the slot refused): not waited for.
      isFinal: (err: unknown) => typeof err === 'object' && err !== null && refusedAtStart.has(err),
    };
    // The ping, the lanes and the WAL slot are one step: a session ended between them (a server
    // restarting) is waited for like a refused ping, not a reason to die.
    const ready = await waitFor('postgres', database, async () => {
      await pingDatabase(db);
      try {
        await seedLanes(db);
        await walMode?.prepare();
      } catch (err) {
        if (isDatabaseOutage(err)) throw err; // a server restarting, or not promoted yet: waited for
        const mapped = mapSqlError(err); // an unmigrated database: "run cairn migrate"
        if (mapped instanceof ConfigurationError)
          throw new ConfigurationError(`${database.address}: ${mapped.message}`, err);
        if (typeof mapped === 'object' && mapped !== null) refusedAtStart.add(mapped);
        throw mapped;
      }
    });
    if (ready === 'stopped') return;
    if (options.wakeOnNotify) {
      await wakeup
        .listen(options.wakeOnNotify)
        .catch((err: Error) => log.warn({ err: err.message }, 'LISTEN failed; polling only'));
    }
    const broker = { address: options.publisher.address, isConfigurationError: isKafkaConfigurationError };
    const connected = await waitFor('kafka', broker, () =>
      options.publisher.connect().catch(async (err: unknown) => {
        await options.publisher.disconnect().catch(() => {});
        throw err;
      }),
    );
    if (connected === 'stopped') {
      await wakeup.end();
      return;
    }
    // A monotonic clock: a wall clock stepped back (NTP) stopped renewals until it caught up,
    // and the leases, timed by the database, expired under a relay still publishing.
    let lastRebalance = Number.NEGATIVE_INFINITY;
    let idle = 1;
    try {
      while (!stopping) {
        try {
          if (aside.asideForMs > 0) {
            await sleep(Math.min(renewEveryMs, aside.asideForMs));
            continue;
          }
          if (performance.now() - lastRebalance >= renewEveryMs) {
            const asked = performance.now(); // the leases run from the query, not its answer
            await rebalance();
            lastRebalance = asked;
          }
          // Without lanes nothing waits for the broker here: say so (the metric would alert forever).
          if (lanes.owned.size === 0 && stats.waitingFor === 'kafka') stats.waitingFor = null;
          const publishedBefore = stats.published;
          const { n, full } =
            lanes.owned.size === 0
              ? { n: 0, full: false }
              : walMode
                ? await walMode.step()
                : await processBatch();
          wakeup.settled(n > 0);
          // Sent: acknowledged by the broker (a WAL step's rows may only have moved to the table).
          stats.published > publishedBefore ? aside.sent() : aside.idle();
          if (full) {
            idle = 1;
            stats.idleMs = 1;
            continue;
          }
          // Never sleep past a lane renewal: the leases would expire under a sleeping relay.
          idle = n > 0 ? 1 : Math.min(maxIdleMs, renewEveryMs, idle * 2);
          stats.idleMs = idle;
          // Streaming, the next rows wake the relay as they arrive (at once when some are
          // buffered): a sleep(0) after each batch was a timer's millisecond more per message.
          await (walMode?.wait(idle) || sleep(n > 0 ? 0 : idle));
        } catch (err) {
          if (walMode && err instanceof ConfigurationError) throw err; // the WAL mode as configured cannot work
          prefetch = undefined;
          walMode?.holdAll(); // what was taken from the stream is in the table: the sweep sends it
          await deletes.finish().catch(() => {});
          log.error({ err: (err as Error).message }, 'relay iteration failed; retrying');
          await sleep(Math.min(1000, maxIdleMs * 2));
          if (err instanceof PublishFailed) {
            // Rows are held until the broker acknowledges them: say so where an operator looks
            // (/readyz answers 503, cairn_relay_waiting_for 1) until a batch goes through.
            stats.waitingFor = 'kafka';
            if (aside.failed(err.cause)) {
              await stepAside().catch((e: Error) => log.warn({ err: e.message }, 'could not step aside'));
              lastRebalance = Number.NEGATIVE_INFINITY;
            }
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
      await deletes.finish().catch(() => {});
      await walMode?.stop();
      await wakeup.end();
      await releaseLanes(db, instanceId, [...lanes.owned.keys()]).catch(() => {});
      await forgetInstance(db, instanceId, ttlMs).catch(() => {});
      await options.publisher.disconnect().catch(() => {});
      lanes.drop();
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
      wakeup.wake();
      await running;
    },
    stats: () => ({
      ...stats,
      waitMs: { ...stats.waitMs },
      ...(walMode && { wal: walMode.stats() }),
    }),
  };
  return withObservations(relay, publishing.observed);
}
