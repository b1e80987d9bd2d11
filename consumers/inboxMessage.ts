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

/**
 * Refuses a message whose id, key or tenant Postgres cannot store (a NUL byte, refused in
 * text: 22021). Only a producer outside Cairn writes one; its inbox row would fail the chunk
 * and then the message alone at every attempt, so it is dead-lettered (its handler never runs)
 * and the partition moves on.
 */
export function refuseUnstorable(m: InboxMessage): void {
  const nul = '\u0000';
  // The usual case first, with nothing made per message (it runs for every message consumed).
  if (!m.messageId.includes(nul) && !m.key?.includes(nul) && !m.tenantId?.includes(nul)) return;
  const fields = [
    ['cairn-message-id', m.messageId],
    ['key', m.key],
    ['cairn-tenant', m.tenantId],
  ] as const;
  const issues = fields
    .filter(([, v]) => v?.includes(nul))
    .map(([path, value]) => ({
      path,
      message: 'holds a NUL byte, which Postgres does not store in text',
      value,
    }));
  if (issues.length > 0)
    throw new ValidationError(`message at ${m.topic}:${m.partition}:${m.offset}`, issues);
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
