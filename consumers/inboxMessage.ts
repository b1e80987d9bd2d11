import { ValidationError } from '../src/errors.js';
import type { ReceivedMessage } from '../src/kafka/subscriber.js';
import { HEADER } from '../src/outbox/wire.js';
import type { ConsumedMessage } from '../src/state/changelog.js';

/**
 * A message as the handler sees it: Kafka's coordinates and bytes, and what Cairn's headers
 * say about it.
 */
export interface InboxMessage {
  /** The `cairn-message-id` header, or topic:partition:offset for messages from outside Cairn. */
  messageId: string;
  topic: string;
  partition: number;
  offset: string;
  key: string | null;
  headers: Readonly<Record<string, string>>;
  value: Buffer | null;
  /** The Kafka record's timestamp, in ms since the epoch. */
  timestamp?: number;
  /** The tenant whose message it is (`cairn-tenant`, set by the relay from the outbox row). */
  tenantId: string | undefined;
  /** The task whose change caused the message (`cairn-task-id`), when it has one. */
  taskId: string | undefined;
  /** The task version that caused the message (`cairn-task-version`), when it has one. */
  taskVersion: number | undefined;
  /** The message's place among the messages of that change (`cairn-task-seq`), from 0. */
  taskSeq: number;
  /** The value parsed as JSON (null for an empty value). */
  json<T = unknown>(): T;
}

const count = (v: string | undefined) => (v !== undefined && /^\d{1,15}$/.test(v) ? Number(v) : undefined);

/**
 * An InboxMessage whose json() lives on the prototype: one object per message, not also a
 * closure per message.
 */
class ReceivedInboxMessage implements InboxMessage {
  readonly messageId: string;
  readonly topic: string;
  readonly partition: number;
  readonly offset: string;
  readonly key: string | null;
  readonly headers: Readonly<Record<string, string>>;
  readonly value: Buffer | null;
  readonly timestamp: number | undefined;
  readonly tenantId: string | undefined;
  readonly taskId: string | undefined;
  readonly taskVersion: number | undefined;
  readonly taskSeq: number;

  constructor(m: ReceivedMessage) {
    this.messageId = m.headers[HEADER.messageId] ?? `${m.topic}:${m.partition}:${m.offset}`;
    this.topic = m.topic;
    this.partition = m.partition;
    this.offset = m.offset;
    this.key = m.key;
    this.headers = m.headers;
    this.value = m.value;
    this.timestamp = m.timestamp;
    this.tenantId = m.headers[HEADER.tenant] || undefined;
    this.taskId = m.headers[HEADER.taskId] || undefined;
    this.taskVersion = count(m.headers[HEADER.taskVersion]);
    this.taskSeq = count(m.headers[HEADER.taskSeq]) ?? 0;
  }

  json<T = unknown>(): T {
    return JSON.parse(this.value?.toString('utf8') ?? 'null') as T;
  }
}

export function toInboxMessage(m: ReceivedMessage): InboxMessage {
  return new ReceivedInboxMessage(m);
}

const NUL = '\u0000';
/**
 * Bytes past which a field is not stored as it is: a btree entry holds at most 2,704 bytes, and
 * the inbox indexes (group, tenant, id) and (tenant, key). Cairn's own ids are uuids, its
 * tenants short names, its keys at most 2 KiB (the outbox's limit).
 */
const MAX_BYTES = { 'cairn-message-id': 1024, 'cairn-tenant': 256, key: 2048 } as const;

type Field = keyof typeof MAX_BYTES;

/**
 * The ids a dead letter of a message the inbox cannot store is recorded under (its Kafka
 * coordinates, deadLetterIdentity). No message may take one as its own: a producer's
 * `topic:0:1` took the id of the dead letter at that offset, which was then dropped as
 * "applied by another consumer" (review). Only the copy a replay sends of such a letter is
 * applied under it (insertInboxRows.ts replayedLetter).
 */
export const COORDINATES = 'cairn-offset:';

/** Why `value` cannot be stored as it is in `field`, or undefined (`coordinates`: a letter's id may be one). */
function unstorable(field: Field, value: string | null | undefined, coordinates = false): string | undefined {
  if (value === null || value === undefined) return undefined;
  if (field === 'cairn-message-id' && !coordinates && value.startsWith(COORDINATES))
    return `starts with ${COORDINATES}, the ids Cairn gives the dead letters of messages it cannot store`;
  if (value.includes(NUL)) return 'holds a NUL byte, which Postgres does not store in text';
  // Bytes only when the characters could exceed the bound (UTF-8 takes at most 3 per UTF-16 unit).
  if (value.length * 3 > MAX_BYTES[field] && Buffer.byteLength(value) > MAX_BYTES[field])
    return `is over ${MAX_BYTES[field]} bytes, more than the inbox's index holds`;
  return undefined;
}

/** Whether `m` is, by its id, the replayed copy of a dead letter recorded under its coordinates (to be checked). */
export function replayedCopy(m: InboxMessage): boolean {
  return (
    m.messageId.startsWith(COORDINATES) &&
    unstorable('cairn-message-id', m.messageId, true) === undefined &&
    unstorable('key', m.key) === undefined &&
    unstorable('cairn-tenant', m.tenantId) === undefined
  );
}

/** Whether the inbox can store `m`'s id, key and tenant as they are (nothing is made per message). */
export function storable(m: InboxMessage): boolean {
  return (
    unstorable('cairn-message-id', m.messageId) === undefined &&
    unstorable('key', m.key) === undefined &&
    unstorable('cairn-tenant', m.tenantId) === undefined
  );
}

/**
 * Refuses a message whose id, key or tenant the inbox cannot store: a NUL byte (refused in
 * text: 22021), or more bytes than its index holds (54000). Only a producer outside Cairn
 * writes one; its inbox row would fail the chunk, then the message alone at every attempt, so
 * it is dead-lettered (its handler never runs) and the partition moves on.
 */
export function refuseUnstorable(m: InboxMessage): void {
  if (storable(m)) return;
  const fields = [
    ['cairn-message-id', m.messageId],
    ['key', m.key],
    ['cairn-tenant', m.tenantId],
  ] as const;
  const issues = fields.flatMap(([path, value]) => {
    const why = unstorable(path, value);
    return why === undefined ? [] : [{ path, message: why, value: value?.slice(0, 200) }];
  });
  throw new ValidationError(`message at ${m.topic}:${m.partition}:${m.offset}`, issues);
}

/**
 * What a dead letter is recorded under (its inbox row, its inbox_dlq row, the check that no
 * consumer applied it). A message whose id cannot be stored as it is goes under its Kafka
 * coordinates (`cairn-offset:topic:partition:offset`, an id no message may take) and its tenant: a NUL
 * replaced, or a value cut, would make it another message's id. One whose tenant cannot be
 * stored goes under its coordinates and no tenant (it is no tenant's: `cairn inbox replay`
 * refuses it). A key that cannot be stored is kept with NUL replaced (it is not what the row is
 * unique by), and not in the inbox row when too long for its index.
 */
export function deadLetterIdentity(m: InboxMessage): {
  messageId: string;
  tenantId: string | null;
  key: string | null;
  inboxKey: string | null;
} {
  const key = m.key === null ? null : m.key.replaceAll(NUL, '\uFFFD');
  const inboxKey = key !== null && unstorable('key', key) === undefined ? key : null;
  const at = `${COORDINATES}${m.topic}:${m.partition}:${m.offset}`;
  if (unstorable('cairn-tenant', m.tenantId)) return { messageId: at, tenantId: null, key, inboxKey };
  const messageId = unstorable('cairn-message-id', m.messageId) ? at : m.messageId;
  return { messageId, tenantId: m.tenantId ?? null, key, inboxKey };
}

/** What a changelog record written by `m`'s handler says it consumed. */
export function consumedAs(groupId: string, m: InboxMessage): ConsumedMessage {
  return {
    consumer_group: groupId,
    message_id: m.messageId,
    topic: m.topic,
    partition: m.partition,
    offset: m.offset,
    key: m.key,
  };
}
