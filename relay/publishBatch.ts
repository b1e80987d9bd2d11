import pRetry, { AbortError } from 'p-retry';
import type { Db } from '../src/db/database.js';
import { CairnError, CairnErrorCodes, LeaseLostError, UnavailableError } from '../src/errors.js';
import type { KafkaAdmin } from '../src/kafka/admin.js';
import { isPoisonError, isProducerStateError, isUnknownTopic } from '../src/kafka/classifyError.js';
import { PartlyPublishedError } from '../src/kafka/partlyPublished.js';
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
  /** Extends this relay's lane leases when a renewal is due: called through an isolation's long steps. */
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

/** A row and the message it becomes (Cairn's headers from its columns, src/outbox/wire.ts). */
export interface Ready {
  row: ClaimedRow;
  message: PublishMessage;
}
export const keyOf = (r: ClaimedRow) => `${r.tenant_id ?? ''}\u0000${r.topic}\u0000${r.key}`;

/**
 * Parks the row's key at it. A LeaseLostError when this relay no longer holds the row's lane
 * under its token (it was slow: another relay took the lane and may have sent the message):
 * nothing is parked, and the lane's new owner decides.
 */
async function park(c: PublishContext, r: ClaimedRow, err: unknown): Promise<void> {
  await c.keepLanes();
  await c.hooks.beforePark?.(r.message_id);
  const token = c.fenceOf(r.lane);
  const lost = () =>
    new LeaseLostError(`lane ${r.lane} is no longer this relay's: key not parked at ${r.message_id}`);
  if (token === undefined) throw lost();
  // A WAL message has no row to park its key at: it becomes one (relay/wal/walToTable.ts).
  if (r.emitted) await writeToTable(c.db, [r]);
  const message = (err as Error).message ?? String(err);
  const held = await parkKey(c.db, {
    tenant: r.tenant_id,
    topic: r.topic,
    key: r.key,
    messageId: r.message_id,
    id: r.id,
    error: message,
    lane: { lane: r.lane, owner: c.instanceId, token },
  });
  if (!held) throw lost();
  c.stats.parked++;
  c.log.error(
    { message_id: r.message_id, lane: r.lane, key: r.key, tenant: r.tenant_id, err: message },
    'message can never be published as it is; key parked',
  );
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
      parked.add(keyOf(r));
      await park(c, r, err);
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
    async () => {
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

/**
 * A batch was refused by the broker: publish message by message in id order to find the
 * culprit, park its key (its later messages wait), let every other key go on. Only a
 * refusal parks a key: any other failure here (the broker went away mid-isolation) stops
 * the isolation, and the batch is tried again later with nothing parked.
 *
 * The messages the broker wrote anyway (other partitions of the refused request, named by the
 * refusal: see src/kafka/partlyPublished.ts) count as sent and are not sent again. Should a
 * message still meet the producer's stale idempotence state (a sequence number the broker has
 * used: kafkajs rolled back those of every partition of the refused request), a fresh producer
 * sends it: else the isolation would stop there, and the whole batch go out again, forever.
 */
export async function isolatePoison(
  c: PublishContext,
  batch: readonly Ready[],
  refusal?: unknown,
): Promise<{ sent: number[]; failure?: unknown }> {
  const acknowledged = refusal instanceof PartlyPublishedError ? refusal.acknowledged : undefined;
  const sent: number[] = [];
  const parkedKeys = new Set<string>();
  let freshProducer = false;
  for (const b of batch) {
    if (acknowledged?.has(b.message)) {
      sent.push(b.row.id);
      continue;
    }
    const k = keyOf(b.row);
    if (parkedKeys.has(k)) continue;
    for (;;) {
      try {
        await c.hooks.beforeIsolatedPublish?.(b.row.message_id);
        await sendGroup(c, [b]);
        sent.push(b.row.id);
      } catch (err) {
        if (isProducerStateError(err) && !freshProducer) {
          freshProducer = true;
          c.log.warn(
            { message_id: b.row.message_id, lane: b.row.lane, err: (err as Error).message },
            'the producer state is stale after a refused batch; starting a fresh producer',
          );
          await c.publisher.disconnect().catch(() => {});
          try {
            await c.publisher.connect();
          } catch (e) {
            return { sent, failure: e };
          }
          continue;
        }
        if (!isPoisonError(err)) return { sent, failure: err };
        parkedKeys.add(k);
        const lost = await parked(c, b.row, err);
        if (lost) return { sent, failure: lost };
      }
      break;
    }
  }
  return { sent };
}

/**
 * A batch the broker refused for good, or for a topic it does not have: who went, who is parked
 * (undefined: nothing to isolate, the batch is tried again as it is).
 */
export async function isolate(
  c: PublishContext,
  batch: readonly Ready[],
  err: unknown,
): Promise<{ sent: number[]; failure?: unknown } | undefined> {
  if (isPoisonError(err)) return isolatePoison(c, batch, err);
  if (isUnknownTopic(err)) return isolateMissingTopics(c, batch, err);
  return undefined;
}

/**
 * A batch failed, after its retries, because the broker has no such topic (a topic
 * auto-creation cannot make, one colliding with another by '.' and '_', auto-creation off).
 * One such row, a tenant's own, held every lane of the relay for good. Each topic's messages
 * are sent on their own: when another topic's go through (the broker is there), the keys of
 * each topic it does not have, tried once more after that, are parked (their order holds; an
 * operator creates the topic, or skips the message, and releases them). When none goes, nothing
 * is parked (a broker just restarted answers so for a moment) and the batch is tried again.
 */
async function isolateMissingTopics(
  c: PublishContext,
  batch: readonly Ready[],
  refusal: unknown,
): Promise<{ sent: number[]; failure?: unknown } | undefined> {
  const byTopic = new Map<string, Ready[]>();
  for (const b of batch) {
    const group = byTopic.get(b.message.topic);
    if (group) group.push(b);
    else byTopic.set(b.message.topic, [b]);
  }
  const absent = await absentTopics(c, [...byTopic.keys()]);
  if (absent !== undefined && absent.size > 0) {
    // The cluster says it lacks these: the other topics are sent; each of these is tried once
    // more, and parked only if it fails again and a second listing still lacks it. A broker
    // back from a restart may list what it has not loaded yet (review): never one answer alone.
    const sent: number[] = [];
    const failing: Array<{ topic: string; group: Ready[]; err: unknown }> = [];
    for (const [topic, group] of byTopic) {
      try {
        await sendGroup(c, group);
        for (const b of group) sent.push(b.row.id);
      } catch (err) {
        if (!absent.has(topic) || !isUnknownTopic(err)) return { sent, failure: err };
        failing.push({ topic, group, err });
      }
    }
    const still =
      failing.length > 0
        ? await absentTopics(
            c,
            failing.map((f) => f.topic),
          )
        : new Set<string>();
    for (const f of failing) {
      if (!still?.has(f.topic)) return { sent, failure: f.err };
      const lost = await parkEach(c, f.group, f.err);
      if (lost) return { sent, failure: lost };
    }
    return { sent };
  }
  if (byTopic.size < 2) return undefined; // nothing to tell the broker from the topic by
  const sent: number[] = [];
  const missing: Array<{ group: Ready[]; err: unknown }> = [];
  for (const group of byTopic.values()) {
    try {
      await sendGroup(c, group);
      for (const b of group) sent.push(b.row.id);
    } catch (err) {
      if (isUnknownTopic(err)) missing.push({ group, err });
      else if (isPoisonError(err)) {
        const r = await isolatePoison(c, group, err);
        sent.push(...r.sent);
        if (r.failure !== undefined) return { sent, failure: r.failure };
      } else return { sent, failure: err };
    }
  }
  if (sent.length === 0) return { sent, failure: missing[0]?.err ?? refusal };
  for (const { group, err } of missing) {
    // Once more, now that another topic went through: a broker back from a restart answered
    // so for every topic, and a group tried before it was back is not one it lacks (review).
    try {
      await sendGroup(c, group);
      for (const b of group) sent.push(b.row.id);
      continue;
    } catch (again) {
      if (!isUnknownTopic(again)) return { sent, failure: again };
    }
    const lost = await parkEach(c, group, err);
    if (lost) return { sent, failure: lost };
  }
  return { sent };
}

/**
 * Parks the row's key, in an isolation: the LeaseLostError when the lane was lost (the
 * isolation stops there; what it sent is deleted, under the lanes still held).
 */
async function parked(c: PublishContext, r: ClaimedRow, err: unknown): Promise<LeaseLostError | undefined> {
  try {
    await park(c, r, err);
    return undefined;
  } catch (e) {
    if (e instanceof LeaseLostError) return e;
    throw e;
  }
}

/**
 * Sends messages in an isolation, the leases extended first when due (each step may retry for
 * seconds). A LeaseLostError, nothing sent, when a message's lane is no longer this relay's:
 * it was slow, and the lane's new owner may have sent the message already (review).
 */
async function sendGroup(c: PublishContext, group: readonly Ready[]): Promise<void> {
  await c.keepLanes();
  const lost = group.find((b) => c.fenceOf(b.row.lane) === undefined);
  if (lost) {
    throw new LeaseLostError(
      `lane ${lost.row.lane} is no longer this relay's: its isolation stops at ${lost.row.message_id}`,
    );
  }
  await publishWithRetry(c, group);
}

/** Parks each key of `group` at its first message; the LeaseLostError if a lane was lost. */
async function parkEach(
  c: PublishContext,
  group: readonly Ready[],
  err: unknown,
): Promise<LeaseLostError | undefined> {
  const keys = new Set<string>();
  for (const b of group) {
    const k = keyOf(b.row);
    if (keys.has(k)) continue;
    keys.add(k);
    const lost = await parked(c, b.row, err);
    if (lost) return lost;
  }
  return undefined;
}

/**
 * Which of `topics` the cluster does not have, as its admin answers within 5 s; undefined: no
 * admin, no answer, or an answer naming no topic at all (a broker that has loaded nothing yet).
 */
async function absentTopics(c: PublishContext, topics: readonly string[]): Promise<Set<string> | undefined> {
  if (!c.admin) return undefined;
  await c.keepLanes();
  let timer: NodeJS.Timeout | undefined;
  try {
    const listed = await Promise.race([
      c.admin.listTopics(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new UnavailableError('the cluster did not list its topics within 5 s')),
          5_000,
        );
      }),
    ]);
    const has = new Set(listed.filter((t) => !t.startsWith('__')));
    if (has.size === 0) return undefined;
    return new Set(topics.filter((t) => !has.has(t)));
  } catch (err) {
    c.log.warn({ err: (err as Error).message }, 'could not list the topics; the batch is tried again');
    return undefined;
  } finally {
    clearTimeout(timer);
  }
}
