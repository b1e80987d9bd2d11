/**
 * Reading what a broker holds for the failover check: every message on a set of topics up to
 * a snapshot of their end offsets, and the consumer groups' committed offsets, each read again
 * at the end of the check to tell whether anything moved while it ran.
 */
import { randomUUID } from 'node:crypto';
import type { Kafka } from 'kafkajs';
import pRetry from 'p-retry';
import { UnavailableError } from '../errors.js';
import { connectOrUnavailable } from '../kafka/classifyError.js';
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

/** Each group's committed offsets on its topics, as kafkajs's fetchOffsets gives them. */
export type GroupCommits = Map<
  string,
  Array<{ topic: string; partitions: Array<{ partition: number; offset: string }> }>
>;

export async function groupOffsets(
  kafka: Kafka,
  consumers: ReadonlyArray<{ groupId: string; topics: readonly string[] }>,
): Promise<GroupCommits> {
  const out: GroupCommits = new Map();
  if (consumers.length === 0) return out;
  const admin = kafka.admin();
  await connectOrUnavailable(admin, 'the failover check');
  try {
    for (const c of consumers) {
      out.set(c.groupId, await admin.fetchOffsets({ groupId: c.groupId, topics: [...c.topics] }));
    }
  } finally {
    await admin.disconnect();
  }
  return out;
}

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
  kafka: Kafka,
  topics: readonly string[],
  deadlineMs = 60_000,
  opts: { values?: boolean } = {},
): Promise<SeenMessage[]> {
  return (await readTopicsSnapshot(kafka, topics, deadlineMs, opts)).messages;
}

/** End offsets by "topic/partition" (the next offset to be written), as a snapshot saw them. */
export type EndOffsets = Map<string, { low: bigint; high: bigint }>;

/** readTopicsToEnd, with each partition's offsets at the time of the call. */
export async function readTopicsSnapshot(
  kafka: Kafka,
  topics: readonly string[],
  deadlineMs = 60_000,
  opts: { values?: boolean } = {},
): Promise<{ messages: SeenMessage[]; ends: EndOffsets }> {
  const ends = await endOffsets(kafka, topics, deadlineMs);
  return { messages: await readUpTo(kafka, topics, ends, deadlineMs, opts), ends };
}

export async function endOffsets(
  kafka: Kafka,
  topics: readonly string[],
  deadlineMs: number,
): Promise<EndOffsets> {
  const ends: EndOffsets = new Map();
  // No retries inside kafkajs: it would turn a retriable "not the leader" into a
  // non-retriable "retries exceeded" before the retry below could see it.
  const admin = kafka.admin({ retry: { retries: 0 } });
  await connectOrUnavailable(admin, 'the failover check');
  try {
    for (const topic of topics) {
      // Right after a broker restart or a leader election the broker answers "not the leader"
      // or "in the middle of a leadership election" for a while (a minute on a starved
      // machine): an outage, not an answer. Retried until the deadline; anything else is thrown.
      const offsets = await pRetry(() => admin.fetchTopicOffsets(topic), {
        retries: Number.POSITIVE_INFINITY,
        maxRetryTime: deadlineMs,
        minTimeout: 200,
        maxTimeout: 3000,
        shouldRetry: ({ error }) => (error as { retriable?: unknown }).retriable === true,
      });
      for (const p of offsets)
        ends.set(`${topic}/${p.partition}`, { low: BigInt(p.low), high: BigInt(p.high) });
    }
  } finally {
    await admin.disconnect();
  }
  return ends;
}

async function readUpTo(
  kafka: Kafka,
  topics: readonly string[],
  ends: EndOffsets,
  deadlineMs: number,
  opts: { values?: boolean },
): Promise<SeenMessage[]> {
  const seen: SeenMessage[] = [];
  const remaining = new Map<string, bigint>(); // "topic/partition" -> last offset to read
  for (const [id, e] of ends) if (e.high > e.low) remaining.set(id, e.high - 1n);
  if (remaining.size === 0) return seen;
  const consumer = kafka.consumer({ groupId: `cairn-failover-check-${randomUUID()}`, maxWaitTimeInMs: 100 });
  await consumer.connect();
  try {
    await consumer.subscribe({ topics: [...topics], fromBeginning: true });
    let done!: () => void;
    const finished = new Promise<void>((r) => {
      done = r;
    });
    await consumer.run({
      eachMessage: async ({ topic, partition, message }) => {
        const header = (name: string) => message.headers?.[name]?.toString() || null;
        const version = Number(header(HEADER.taskVersion));
        seen.push({
          topic,
          partition,
          offset: message.offset,
          key: message.key?.toString() ?? '',
          tenant: header(HEADER.tenant),
          taskId: header(HEADER.taskId),
          version: Number.isInteger(version) ? version : null,
          messageId: header(HEADER.messageId) ?? '',
          timestamp: message.timestamp,
          ...(opts.values
            ? {
                value: message.value,
                headers: Object.fromEntries(
                  Object.entries(message.headers ?? {}).map(([k, v]) => [k, String(v ?? '')]),
                ),
              }
            : {}),
        });
        const id = `${topic}/${partition}`;
        const last = remaining.get(id);
        if (last !== undefined && BigInt(message.offset) >= last) remaining.delete(id);
        if (remaining.size === 0) done();
      },
    });
    const timer = setTimeout(done, deadlineMs);
    await finished;
    clearTimeout(timer);
    if (remaining.size > 0) {
      throw new UnavailableError(
        `failover check: could not read ${[...remaining.keys()].join(', ')} to its end within ${deadlineMs} ms`,
      );
    }
  } finally {
    await consumer.disconnect();
  }
  return seen;
}
