import { LeaseLostError, UnavailableError } from '../src/errors.js';
import { isPoisonError, isProducerStateError, isUnknownTopic } from '../src/kafka/classifyError.js';
import { PartlyPublishedError } from '../src/kafka/partlyPublished.js';
import { keyOf, type PublishContext, park, publishWithRetry, type Ready, stillHeld } from './publishBatch.js';
import type { ClaimedRow } from './sql/claimBatch.js';

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
        const r = await parked(c, b.row, err);
        if (r instanceof LeaseLostError) return { sent, failure: r };
        // Skipped meanwhile (the row gone): the key's next message is its head, and goes on
        // (review: left behind, in the WAL mode the key's later messages overtook it).
        if (r === 'parked') parkedKeys.add(k);
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
 * Parks the row's key, in an isolation: 'parked', 'row gone' (skipped meanwhile: nothing
 * parked), or the LeaseLostError when the lane was lost (the isolation stops there; what it
 * sent is deleted, under the lanes still held).
 */
async function parked(
  c: PublishContext,
  r: ClaimedRow,
  err: unknown,
): Promise<'parked' | 'row gone' | LeaseLostError> {
  try {
    return (await park(c, r, err)) ? 'parked' : 'row gone';
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
  await stillHeld(c, group);
  await publishWithRetry(c, group);
}

/**
 * Parks each key of `group` at its first message still in the outbox (one skipped meanwhile:
 * at the next); the LeaseLostError if a lane was lost.
 */
async function parkEach(
  c: PublishContext,
  group: readonly Ready[],
  err: unknown,
): Promise<LeaseLostError | undefined> {
  const keys = new Set<string>();
  for (const b of group) {
    const k = keyOf(b.row);
    if (keys.has(k)) continue;
    const r = await parked(c, b.row, err);
    if (r instanceof LeaseLostError) return r;
    if (r === 'parked') keys.add(k);
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
