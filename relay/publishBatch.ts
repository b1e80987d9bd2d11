import pRetry, { AbortError } from 'p-retry';
import type { Db } from '../src/db/database.js';
import { CairnError, CairnErrorCodes, LeaseLostError } from '../src/errors.js';
import type { KafkaAdmin } from '../src/kafka/admin.js';
import { isPoisonError, isProducerStateError } from '../src/kafka/classifyError.js';
import type { Publisher, PublishMessage } from '../src/kafka/publisher.js';
import type { Logger } from '../src/logger.js';
import type { Observations } from '../src/metrics/observations.js';
import { BadRowError, wireHeaders } from '../src/outbox/wire.js';
import { inPublishSpan, observeBatch, type RelayObservation } from './publishSpan.js';
import type { ClaimedRow } from './sql/claimBatch.js';
import { parkKey } from './sql/parkKey.js';
import type { RelayStats, RelayTestHooks } from './types.js';
import { writeToTable } from './wal/walToTable.js';

/**
 * From claimed rows to acknowledged messages: Cairn's headers from the row's columns, retries
 * for what is transient, and a key parked when its head message can never be published (a
 * row that cannot be encoded, or a broker refusal), so every other key flows.
 */
export interface PublishContext {
  db: Db;
  instanceId: string;
  /** The fencing token this relay holds `lane` under now (undefined: not held). */
  fenceOf(lane: number): number | undefined;
  /**
   * Extends this relay's lane leases when a renewal is due (a lease already run out is lost):
   * called through long steps. Rejects with a LanesUnknownError when Postgres does not answer.
   */
  keepLanes(): Promise<void>;
  publisher: Publisher;
  /** Which topics the cluster has (RelayOptions.admin). */
  admin: KafkaAdmin | undefined;
  log: Logger;
  stats: RelayStats;
  publishRetries: number | undefined;
  hooks: RelayTestHooks;
  /** Where acknowledged batches are reported for the histograms (relay/metrics.ts). */
  observed: Observations<RelayObservation>;
}

/** A batch the broker did not acknowledge (its rows stay, the loop tries again; the cause says why). */
export class PublishFailed extends CairnError {
  constructor(cause: unknown) {
    super(CairnErrorCodes.PublishFailed, `publish failed: ${(cause as Error)?.message ?? String(cause)}`, {
      retriable: true,
      cause,
    });
  }
}

/**
 * The lane leases could not be renewed (Postgres did not answer): whether this relay still
 * holds its lanes is unknown, so nothing more is sent in this step. Not the broker's failure.
 */
export class LanesUnknownError extends CairnError {
  constructor(cause: unknown) {
    super(
      CairnErrorCodes.Unavailable,
      `could not renew the relay's lanes: ${(cause as Error)?.message ?? String(cause)}`,
      { retriable: true, cause },
    );
  }
}

/** A step stopped for its lanes (lost, or not known to be held): no broker's failure. */
export const isLaneError = (err: unknown): err is LeaseLostError | LanesUnknownError =>
  err instanceof LeaseLostError || err instanceof LanesUnknownError;

/** A row and the message it becomes (Cairn's headers from its columns, src/outbox/wire.ts). */
export interface Ready {
  row: ClaimedRow;
  message: PublishMessage;
}
export const keyOf = (r: ClaimedRow) => `${r.tenant_id ?? ''}\u0000${r.topic}\u0000${r.key}`;

/**
 * Parks the row's key at it: true, or false when the row is gone (an operator skipped it
 * meanwhile: the key is not parked, and its next message is its head). A LeaseLostError when
 * this relay no longer holds the row's lane under its token (it was slow: another relay took
 * the lane and may have sent the message): nothing is parked, the lane's new owner decides.
 */
export async function park(c: PublishContext, r: ClaimedRow, err: unknown): Promise<boolean> {
  await c.keepLanes();
  await c.hooks.beforePark?.(r.message_id);
  const token = c.fenceOf(r.lane);
  const lost = () =>
    new LeaseLostError(`lane ${r.lane} is no longer this relay's: key not parked at ${r.message_id}`);
  if (token === undefined) throw lost();
  // A WAL message has no row to park its key at: it becomes one (relay/wal/walToTable.ts).
  if (r.emitted) await writeToTable(c.db, [r]);
  const message = (err as Error).message ?? String(err);
  const result = await parkKey(c.db, {
    tenant: r.tenant_id,
    topic: r.topic,
    key: r.key,
    messageId: r.message_id,
    id: r.id,
    error: message,
    lane: { lane: r.lane, owner: c.instanceId, token },
  });
  if (result === 'lane lost') throw lost();
  if (result === 'row gone') return false;
  c.stats.parked++;
  c.log.error(
    { message_id: r.message_id, lane: r.lane, key: r.key, tenant: r.tenant_id, err: message },
    'message can never be published as it is; key parked',
  );
  return true;
}

/**
 * Turns claimed rows into messages. A row that can never be published as it is (its stored
 * headers are not an object of strings: written by hand, past the outbox's CHECK) parks its
 * key before anything reaches the client: every other key flows, this one's order holds.
 */
export async function toMessages(
  c: PublishContext,
  rows: readonly ClaimedRow[],
): Promise<{ ready: Ready[]; parkedAny: boolean }> {
  const ready: Ready[] = [];
  const parked = new Set<string>();
  for (const r of rows) {
    // A key's string is built only once some key is parked (rarely): not once per message.
    if (parked.size > 0 && parked.has(keyOf(r))) continue;
    try {
      // kafkajs refuses an empty topic itself ('Invalid topic', not a broker refusal): it
      // would fail every batch it is in, for every lane. Only a tenant's own INSERT writes one.
      if (r.topic === '') throw new BadRowError(r.message_id, 'its topic is empty');
      ready.push({
        row: r,
        message: { topic: r.topic, key: r.key, value: r.payload, headers: wireHeaders(r.headers, r) },
      });
    } catch (err) {
      if (!(err instanceof BadRowError)) throw err;
      // Skipped meanwhile: the key's next rows are its head, and go on (review: left behind,
      // in the WAL mode the key's later messages overtook them).
      if (await park(c, r, err)) parked.add(keyOf(r));
    }
  }
  return { ready, parkedAny: parked.size > 0 };
}

/**
 * Publishes with retries for retriable errors; a non-retriable one is thrown as is. One
 * producer span covers the batch and its retries (relay/publishSpan.ts).
 */
export async function publishWithRetry(c: PublishContext, batch: readonly Ready[]): Promise<void> {
  await inPublishSpan(batch, () => retrying(c, batch));
  // After the broker's ack nothing may throw: the batch would count as failed and be sent again.
  try {
    if (c.observed.listening) c.observed.emit(observeBatch(batch, Date.now()));
  } catch (err) {
    c.log.warn({ err: (err as Error).message }, 'could not record the batch in the relay metrics');
  }
}

async function retrying(c: PublishContext, batch: readonly Ready[]): Promise<void> {
  await pRetry(
    async (attempt) => {
      // A retry may come after the lease ran out and the lane's new owner sent on (review).
      if (attempt > 1) {
        try {
          await stillHeld(c, batch);
        } catch (err) {
          throw new AbortError(err as Error); // no retry: the lane is its new owner's
        }
      }
      try {
        await c.publisher.publish(batch.map((b) => b.message));
      } catch (err) {
        // The same producer would meet the same stale state on every retry: the caller starts
        // a fresh one (the relay does after a failed batch).
        if (isPoisonError(err) || isProducerStateError(err)) throw new AbortError(err as Error);
        throw err;
      }
    },
    {
      retries: c.publishRetries ?? 8,
      minTimeout: 100,
      maxTimeout: 2000,
      onFailedAttempt: ({ error, attemptNumber }) => {
        c.stats.retries++;
        c.log.warn(
          { err: error.message, attempt: attemptNumber, size: batch.length },
          'publish failed; retrying',
        );
      },
    },
  );
}

/** The leases extended when due; a LeaseLostError when a message's lane is no longer this relay's. */
export async function stillHeld(c: PublishContext, batch: readonly Ready[]): Promise<void> {
  await c.keepLanes();
  const lost = batch.find((b) => c.fenceOf(b.row.lane) === undefined);
  if (lost) {
    throw new LeaseLostError(
      `lane ${lost.row.lane} is no longer this relay's: ${lost.row.message_id} not sent (again)`,
    );
  }
}
