/**
 * Reading what a broker holds for the failover check: every message on a set of topics up to
 * a snapshot of their end offsets, and the consumer groups' committed offsets, each read again
 * at the end of the check to tell whether anything moved while it ran.
 */
import pRetry from 'p-retry';
import { messageOf, UnavailableError } from '../errors.js';
import type { KafkaAdmin, TopicRecord } from '../kafka/admin.js';
import { isBrokerUnreachable, isRetriableKafkaError, someInChain } from '../kafka/classifyError.js';
import { HEADER } from '../outbox/wire.js';

/**
 * A partition whose end offset was `before` when the check read the topics and `after` when it
 * finished; with `groupId`, that group's committed offset there (MirrorMaker's checkpoint sync
 * still writing translated offsets, or a consumer still running).
 */
export interface MovedPartition {
  topic: string;
  partition: number;
  groupId?: string;
  before: string;
  after: string;
}

/** Each group's committed offsets on its topics (`-1` where it committed nothing). */
export type GroupCommits = Map<
  string,
  Array<{ topic: string; partitions: Array<{ partition: number; offset: string }> }>
>;

export async function groupOffsets(
  admin: KafkaAdmin,
  consumers: ReadonlyArray<{ groupId: string; topics: readonly string[] }>,
  deadlineMs = 60_000,
): Promise<GroupCommits> {
  const out: GroupCommits = new Map();
  const until = Date.now() + deadlineMs; // one deadline for every group
  for (const c of consumers) {
    // A group's coordinator moving, or still loading its offsets ("not the correct coordinator",
    // a CI run on a busy machine), is a moment's answer, not the group's.
    const committed = await askUntil(`group ${c.groupId}'s offsets`, until, deadlineMs / 10, () =>
      admin.committedOffsets(c.groupId, c.topics),
    );
    out.set(c.groupId, committed);
  }
  return out;
}

/**
 * Asks again after a retriable answer until `until` (ms since the epoch), and for at least a
 * tenth of the call's deadline (`floorMs`): a read that comes late in a long check still
 * outlasts a moment's answer ("not the leader"). Anything else is thrown at once. A broker still
 * not answering then is an outage (UnavailableError: the check exits 75, having concluded
 * nothing), never a finding: also when the client's own retries ran out first (kafkajs throws
 * KafkaJSNumberOfRetriesExceeded, not retriable itself, around the retriable cause).
 */
async function askUntil<T>(what: string, until: number, floorMs: number, ask: () => Promise<T>): Promise<T> {
  try {
    return await pRetry(ask, {
      retries: Number.POSITIVE_INFINITY,
      maxRetryTime: Math.max(floorMs, until - Date.now()),
      minTimeout: 200,
      maxTimeout: 3000,
      shouldRetry: ({ error }) => transient(error),
    });
  } catch (err) {
    if (!transient(err)) throw err;
    throw new UnavailableError(
      `failover check: the broker gave no answer for ${what} in time: ${messageOf(err)}`,
      err,
    );
  }
}

const transient = (err: unknown) =>
  isRetriableKafkaError(err) ||
  isBrokerUnreachable(err) ||
  someInChain(err, (e) => (e as { retriable?: unknown }).retriable === true);

/** Offsets that differ between two reads of the same groups. */
export function movedCommits(before: GroupCommits, after: GroupCommits): MovedPartition[] {
  const flat = (g: GroupCommits) =>
    new Map(
      [...g].flatMap(([groupId, topics]) =>
        topics.flatMap((t) =>
          t.partitions.map((p) => [`${groupId}\u0000${t.topic}\u0000${p.partition}`, p.offset] as const),
        ),
      ),
    );
  const was = flat(before);
  const moved: MovedPartition[] = [];
  for (const [id, offset] of flat(after)) {
    const prev = was.get(id) ?? '-1';
    if (offset === prev) continue;
    const [groupId, topic, partition] = id.split('\u0000') as [string, string, string];
    moved.push({ topic, partition: Number(partition), groupId, before: prev, after: offset });
  }
  return moved;
}

export interface SeenMessage {
  topic: string;
  partition: number;
  offset: string;
  key: string;
  /** From Cairn's own headers (set by the relay from the outbox row, never by a caller). */
  tenant: string | null;
  taskId: string | null;
  version: number | null;
  messageId: string;
  /** The record's timestamp (ms since the epoch, as a string), when read from a broker. */
  timestamp?: string;
  /** The payload, only when asked for (`values`). */
  value?: Buffer | null;
  /** Every header, only when asked for (`values`). */
  headers?: Record<string, string>;
}

/**
 * Reads every message already on `topics`, up to each partition's end at the time of the call;
 * `values` keeps each message's payload as well.
 */
export async function readTopicsToEnd(
  admin: KafkaAdmin,
  topics: readonly string[],
  deadlineMs = 60_000,
  opts: { values?: boolean } = {},
): Promise<SeenMessage[]> {
  return (await readTopicsSnapshot(admin, topics, deadlineMs, opts)).messages;
}

/** End offsets by "topic/partition" (the next offset to be written), as a snapshot saw them. */
export type EndOffsets = Map<string, { low: bigint; high: bigint }>;

/** readTopicsToEnd, with each partition's offsets at the time of the call. */
export async function readTopicsSnapshot(
  admin: KafkaAdmin,
  topics: readonly string[],
  deadlineMs = 60_000,
  opts: { values?: boolean } = {},
): Promise<{ messages: SeenMessage[]; ends: EndOffsets }> {
  const ends = await endOffsets(admin, topics, deadlineMs);
  return { messages: await readUpTo(admin, topics, ends, deadlineMs, opts), ends };
}

export async function endOffsets(
  admin: KafkaAdmin,
  topics: readonly string[],
  deadlineMs: number,
): Promise<EndOffsets> {
  const ends: EndOffsets = new Map();
  const until = Date.now() + deadlineMs; // one deadline for every topic
  for (const topic of topics) {
    // Right after a broker restart or a leader election the broker answers "not the leader"
    // or "in the middle of a leadership election" for a while (a minute on a starved
    // machine): an outage, not an answer.
    const offsets = await askUntil(`topic ${topic}'s offsets`, until, deadlineMs / 10, () =>
      admin.topicOffsets(topic),
    );
    for (const p of offsets)
      ends.set(`${topic}/${p.partition}`, { low: BigInt(p.low), high: BigInt(p.high) });
  }
  return ends;
}

async function readUpTo(
  admin: KafkaAdmin,
  topics: readonly string[],
  ends: EndOffsets,
  deadlineMs: number,
  opts: { values?: boolean },
): Promise<SeenMessage[]> {
  const remaining = new Map<string, bigint>(); // "topic/partition" -> last offset to read
  for (const [id, e] of ends) if (e.high > e.low) remaining.set(id, e.high - 1n);
  if (remaining.size === 0) return [];
  const { records, unread } = await admin.readTopics(topics, remaining, deadlineMs);
  if (unread.length > 0) {
    throw new UnavailableError(
      `failover check: could not read ${unread.join(', ')} to its end within ${deadlineMs} ms`,
    );
  }
  return records.map((r) => seenMessage(r, opts));
}

/** What the check needs of a record: Cairn's headers (set by the relay, never by a caller). */
function seenMessage(r: TopicRecord, opts: { values?: boolean }): SeenMessage {
  const header = (name: string) => r.headers[name] || null;
  const version = Number(header(HEADER.taskVersion));
  return {
    topic: r.topic,
    partition: r.partition,
    offset: r.offset,
    key: r.key?.toString() ?? '',
    tenant: header(HEADER.tenant),
    taskId: header(HEADER.taskId),
    version: Number.isInteger(version) ? version : null,
    messageId: header(HEADER.messageId) ?? '',
    timestamp: r.timestamp,
    ...(opts.values ? { value: r.value, headers: r.headers } : {}),
  };
}
