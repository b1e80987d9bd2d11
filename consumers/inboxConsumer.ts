import { setTimeout as sleep } from 'node:timers/promises';
import type { Trx } from '../src/db/executor.js';
import { isRetriableSqlError } from '../src/db/sqlstate.js';
import { mayRetry, messageOf } from '../src/errors.js';
import type { ReceivedBatch } from '../src/kafka/subscriber.js';
import { silentLogger } from '../src/logger.js';
import { parseOptions } from '../src/options.js';
import { consumptionMark } from '../src/state/changelog.js';
import { chunkSizer } from './chunkSize.js';
import { deadLetterer } from './deadLetterMessage.js';
import { dependencyWait, dependencyWaiter } from './dependencyWait.js';
import { boundedTransactions, DEFAULT_HANDLER_TIMEOUT_MS, HandlerTimeoutError } from './handlerDeadline.js';
import { type BatchHeartbeat, batchHeartbeat, beatingWhile } from './heartbeat.js';
import { InboxConsumerOptionsSchema } from './options.js';
import { type BatchRun, outageJudge } from './outage.js';
import { applyTracing } from './processSpan.js';
import { claimVersion } from './sql/claimVersion.js';
import { inboxKey, insertInboxRows, replayedLetter } from './sql/insertInboxRows.js';
import { schedulePruning } from './sql/pruneInbox.js';

export { type InboxMessage, toInboxMessage } from './inboxMessage.js';
export type {
  AppTables,
  InboxCommitCounts,
  InboxConsumer,
  InboxConsumerOptions,
  InboxHandler,
  InboxStats,
  InboxTestHooks,
  NoCairnNames,
  NoTables,
} from './inboxTypes.js';

import {
  consumedAs,
  type InboxMessage,
  refuseUnstorable,
  replayedCopy,
  storable,
  toInboxMessage,
} from './inboxMessage.js';
import type {
  AppTables,
  InboxCommitCounts,
  InboxConsumer,
  InboxConsumerOptions,
  InboxStats,
  InboxTestHooks,
  NoCairnNames,
  NoTables,
} from './inboxTypes.js';

const SEVEN_DAYS_MS = 7 * 24 * 3600 * 1000;

/**
 * Makes an inbox consumer; nothing connects until run(). Call stop() to end it. Name your
 * tables to write them typed in the handler's transaction:
 * `createInboxConsumer<{ orders: { id: string } }>({ ..., handler: (trx) => trx.insertInto('orders')... })`.
 */
export function createInboxConsumer<Tables extends AppTables = NoTables>(
  options: InboxConsumerOptions<Tables> & NoCairnNames<Tables>,
): InboxConsumer {
  // The transaction is the same object whatever tables its type names.
  return createInboxConsumerWithTestHooks(options as unknown as InboxConsumerOptions, {});
}

/** Internal: `createInboxConsumer` with a hook at a named point, for crash tests. */
export function createInboxConsumerWithTestHooks(
  input: InboxConsumerOptions,
  hooks: InboxTestHooks,
): InboxConsumer {
  const options = parseOptions('inbox consumer options', InboxConsumerOptionsSchema, input);
  const { db, groupId, handler } = options;
  const log = (options.logger ?? silentLogger).child({ component: 'inbox', group: groupId });
  const chunks = chunkSizer(options.chunkSize);
  const maxAttempts = options.maxAttempts ?? 5;
  const retryBaseMs = options.retryBaseMs ?? 100;
  const retryMaxMs = options.retryMaxMs ?? 5000;
  const inTransaction = boundedTransactions(
    db,
    options.handlerTimeoutMs ?? DEFAULT_HANDLER_TIMEOUT_MS,
    log,
    hooks,
  );
  const stats: InboxStats = {
    applied: 0,
    duplicates: 0,
    stale: 0,
    deadLettered: 0,
    retries: 0,
    commits: 0,
    offsetCommitFailures: 0,
  };
  let pruning: { stop(): void } | undefined;
  const stopWaiting = new AbortController();
  const dependencies = dependencyWaiter({
    log,
    signal: stopWaiting.signal,
    maxAttempts,
    retryBaseMs,
    retryMaxMs,
    applied: () => stats.applied,
  });
  const traced = applyTracing(groupId);
  const { databaseAnswers, outage, waitingForDb } = outageJudge({
    db,
    log,
    signal: stopWaiting.signal,
    dependencyBack: (err, run, refused, answered = refused) =>
      dependencies.back(err, run.wait, { refused, answered, beat: () => run.heartbeat.beat() }),
  });
  const deadLetters = deadLetterer({
    db,
    groupId,
    publisher: options.dlqPublisher,
    log,
    onRecorded: () => {
      stats.deadLettered++;
    },
  });

  /** Applies the new messages of a chunk in one transaction; returns counts to add once it committed. */
  async function applyChunk(
    trx: Trx,
    chunk: readonly InboxMessage[],
    heartbeat: BatchHeartbeat | undefined,
    abandoned: AbortSignal,
  ) {
    const counts = { applied: 0, duplicates: 0, stale: 0 };
    const latencies: number[] = [];
    for (const m of chunk)
      if (!storable(m) && !(replayedCopy(m) && (await replayedLetter(trx, groupId, m)))) refuseUnstorable(m);
    const fresh = await insertInboxRows(trx, groupId, chunk);
    // A task changed in a handler records the message in its changelog record (a replay
    // after a failover restores the inbox row from it).
    const mark = consumptionMark(trx);
    try {
      for (const m of chunk) {
        // `fresh` holds each new (tenant, id) once; a second copy in the same chunk is a duplicate too.
        if (!fresh.delete(inboxKey(m))) {
          counts.duplicates++;
          continue;
        }
        if (options.refuseStaleVersions && m.key !== null && m.taskVersion !== undefined) {
          const claimed = await claimVersion(trx, {
            groupId,
            tenantId: m.tenantId ?? null,
            key: m.key,
            version: m.taskVersion,
            seq: m.taskSeq,
            messageId: m.messageId,
          });
          if (!claimed) {
            counts.stale++;
            log.info(
              { message_id: m.messageId, key: m.key, version: m.taskVersion, seq: m.taskSeq },
              'stale message refused',
            );
            continue;
          }
        }
        // Past its deadline the transaction is abandoned: no further handler runs in it.
        abandoned.throwIfAborted();
        mark.applying(consumedAs(groupId, m));
        let seconds: number | undefined;
        const call = () => beatingWhile(heartbeat, () => handler(trx, m), abandoned);
        if (traced.bare(m)) {
          await call();
          seconds = traced.observe(m);
        } else seconds = await traced.run(m, call);
        const stamped = mark.finish();
        if (stamped) await stamped;
        if (seconds !== undefined) latencies.push(seconds);
        counts.applied++;
        // The session lives on through a chunk whose handlers turn slow.
        heartbeat?.beat();
      }
    } finally {
      mark.clear();
    }
    return { counts, latencies };
  }

  function committed(r: { counts: InboxCommitCounts; latencies: number[] }, run: BatchRun): void {
    dependencies.committed(run.wait);
    traced.committed(r.latencies);
    addCounts(r.counts);
  }

  function addCounts(c: InboxCommitCounts): void {
    stats.applied += c.applied;
    stats.duplicates += c.duplicates;
    stats.stale += c.stale;
    // Logged and ignored, thrown or rejected: the transaction is already committed.
    const ignore = (err: unknown) => log.warn({ err: messageOf(err) }, 'onCommitted failed; ignored');
    try {
      const r: unknown = options.onCommitted?.(c);
      if (r instanceof Promise) r.catch(ignore);
    } catch (err) {
      ignore(err);
    }
  }

  /**
   * One message in its own transaction, with retries; dead-lettered when it keeps failing.
   * false when it was neither applied nor dead-lettered (a stop, or the partition lost while
   * Postgres was down): the caller hands the rest of the batch back.
   */
  async function applyAlone(m: InboxMessage, run: BatchRun): Promise<boolean> {
    for (let attempt = 1; ; attempt++) {
      try {
        committed(
          await inTransaction((trx, abandoned) => applyChunk(trx, [m], run.heartbeat, abandoned)),
          run,
        );
        return true;
      } catch (err) {
        const down = await outage(err, run);
        if (down !== 'none') {
          if (down === 'stopped' || !run.isActive()) return false;
          attempt--;
          continue;
        }
        const retriable = mayRetry(err) || isRetriableSqlError(err);
        if (!retriable || attempt >= maxAttempts) {
          try {
            await deadLetters.send(m, err, attempt);
          } catch (failed) {
            // Postgres went away while it was dead-lettered: read again later, nothing lost.
            if ((await outage(failed, run)) === 'none') throw failed;
            return false;
          }
          dependencies.gaveUp(run.wait, err);
          return true;
        }
        if (!run.isActive()) return false; // stopping, or the partition moved: its next owner tries it
        stats.retries++;
        log.warn({ message_id: m.messageId, attempt, err: messageOf(err) }, 'handler failed; retrying');
        // Exponential with full jitter, capped: a message that needs a few seconds (a lease
        // held by a dead worker, say) must not push its retries out to minutes.
        await sleep(Math.random() * Math.min(retryMaxMs, retryBaseMs * 2 ** (attempt - 1)));
      }
    }
  }

  async function onBatch(batch: ReceivedBatch): Promise<void> {
    const messages = batch.messages.map(toInboxMessage);
    const heartbeat = batchHeartbeat(batch, log);
    const run: BatchRun = { isActive: batch.isActive, heartbeat, wait: dependencyWait() };
    try {
      await applyBatch(batch, messages, run);
    } finally {
      dependencies.ended(run.wait);
    }
  }

  async function applyBatch(batch: ReceivedBatch, messages: InboxMessage[], run: BatchRun): Promise<void> {
    const { heartbeat } = run;
    for (let i = 0; i < messages.length; ) {
      if (!batch.isActive() || heartbeat.failed()) return;
      let chunk = messages.slice(i, i + chunks.next());
      // A message the inbox cannot store fails any chunk it is in: the messages before it go
      // together, it goes alone (and is dead-lettered), so one per chunk cannot keep the
      // consumer applying message by message.
      const unstorable = chunk.findIndex((m) => !storable(m));
      if (unstorable >= 0) chunk = chunk.slice(0, Math.max(1, unstorable));
      i += chunk.length;
      /** How many of the chunk, from its first, are applied (or dropped) and committed. */
      let done = chunk.length;
      const started = performance.now();
      try {
        const r = await inTransaction((trx, abandoned) => applyChunk(trx, chunk, heartbeat, abandoned));
        committed(r, run);
        // Paced by handled messages: growing on a chunk of duplicates ran past the session.
        if (r.counts.applied > 0) chunks.took(r.counts.applied, performance.now() - started);
      } catch (err) {
        // Past its deadline the chunk was too large for its handlers' pace: the next is smaller.
        if (err instanceof HandlerTimeoutError) chunks.took(chunk.length, performance.now() - started);
        // Postgres went away: once it answers, the whole chunk again.
        const down = await outage(err, run);
        if (down === 'stopped') return;
        if (down === 'waited') {
          i -= chunk.length;
          continue;
        }
        // Something in the chunk failed and the whole transaction rolled back: apply the
        // messages one by one so one bad message cannot hold back the others. Each in its own
        // transaction, so stopping part-way loses nothing (the rest is read again); after a
        // failed heartbeat it stops, but only after one, and commits the offset of what went:
        // a batch handed back at once each time would never move.
        log.warn({ err: messageOf(err), size: chunk.length }, 'chunk failed; applying one by one');
        done = 0;
        for (const m of chunk) {
          if (!batch.isActive() || (done > 0 && heartbeat.failed())) break;
          if (!(await applyAlone(m, run))) break;
          done++;
          heartbeat.beat();
        }
      }
      stats.commits++;
      hooks.afterDbCommit?.(stats.commits);
      // A partition we no longer own must not get a commit from us; its new owner re-reads
      // from the last committed offset and the inbox turns those messages into duplicates.
      if (!batch.isActive() || done === 0) return;
      const last = chunk[done - 1]!;
      try {
        await options.subscriber.commit(batch.topic, batch.partition, (BigInt(last.offset) + 1n).toString());
        batch.resolveOffset(last.offset);
      } catch (err) {
        stats.offsetCommitFailures++;
        log.warn({ err: messageOf(err), partition: batch.partition }, 'offset commit failed (rebalance?)');
        return;
      }
      if (done < chunk.length) return;
      heartbeat.beat();
    }
  }

  const consumer: InboxConsumer = {
    async run() {
      if ((await databaseAnswers()) === 'stopped') return;
      pruning ??= schedulePruning(db, {
        groupId,
        olderThanMs: options.retentionMs ?? SEVEN_DAYS_MS,
        everyMs: options.pruneEveryMs ?? 3600_000,
        log,
      });
      await options.subscriber.run(onBatch);
    },
    async stop() {
      stopWaiting.abort();
      pruning?.stop();
      await options.subscriber.stop();
      await deadLetters.disconnect();
    },
    stats: () => ({ ...stats }),
    waitingFor: () =>
      waitingForDb()
        ? 'postgres'
        : options.subscriber.waiting()
          ? 'kafka'
          : dependencies.waiting()
            ? 'dependency'
            : null,
  };
  return traced.attach(consumer);
}
