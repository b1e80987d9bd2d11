import { v5 as uuidv5, v7 as uuidv7 } from 'uuid';
import { z } from 'zod';
import { ValidationError } from '../errors.js';
import { zodIssues } from '../schemas/zodIssues.js';
import { activeTraceHeaders } from '../tracing/otel.js';
import { isReservedHeader, RESERVED_PREFIX } from './wire.js';

/** Namespace for message ids derived from a caller's idempotency key (UUIDv5). */
const MESSAGE_ID_NAMESPACE = '6f1d3c5e-8a8f-4d8e-9c47-3c7a0e4b2a11';

export const DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024;

/** Kafka's own rule for topic names: 1-249 of a-z A-Z 0-9 . _ - (and not '.' or '..'). */
export const TopicName = z
  .string()
  .regex(/^[a-zA-Z0-9._-]{1,249}$/, { message: 'must be 1-249 characters of a-z A-Z 0-9 . _ -' })
  .refine((t) => t !== '.' && t !== '..', { message: 'cannot be "." or ".."' });

const TRACEPARENT = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;

/**
 * A message to publish: its topic, key, JSON or bytes payload and headers of your own (no
 * `cairn-*` name: those are Cairn's).
 */
export const OutboxMessageInput = z.strictObject({
  topic: TopicName,
  /** Partition key; defaults to the task id when enqueued through a task update. */
  key: z
    .string()
    .min(1)
    .max(1024)
    .refine((k) => Buffer.byteLength(k) <= 2048, { message: 'must be at most 2048 bytes in UTF-8' })
    .optional(),
  /** JSON (validated by the topic's registered schema, if any) or raw bytes. */
  payload: z.union([z.instanceof(Buffer), z.unknown()]),
  headers: z
    .record(z.string().regex(/^[A-Za-z0-9._-]{1,128}$/), z.string().max(8192))
    .refine((h) => Buffer.byteLength(JSON.stringify(h)) <= 12288, {
      message: 'must be at most 12 KiB in all (as JSON)',
    })
    .optional(),
  /** Makes the message id deterministic: the same key always yields the same message_id. */
  idempotencyKey: z.string().min(1).max(512).optional(),
  /** W3C trace context, forwarded as the `traceparent` header. */
  traceparent: z
    .string()
    .regex(TRACEPARENT, { message: 'must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)' })
    .optional(),
});
/**
 * A message to publish: its topic, key, payload and headers of your own; enqueue it in your
 * transaction.
 */
export type OutboxMessageInput = z.input<typeof OutboxMessageInput>;

export interface OutboxRow {
  message_id: string;
  topic: string;
  key: string;
  /** The caller's headers only: the relay adds Cairn's (wire.ts) from the columns below. */
  headers: Record<string, string>;
  payload: Buffer;
  tenant_id: string | null;
  task_id: string | null;
  task_version: number | null;
  task_seq: number | null;
}

export interface PrepareContext {
  defaultKey?: string;
  /** The task whose change causes the message. */
  taskId?: string;
  taskVersion?: number;
  tenantId?: string;
  schemas: ReadonlyMap<string, z.ZodType>;
  maxPayloadBytes: number;
}

/** Validates one message and turns it into the row to insert; throws ValidationError naming the field. */
export function prepareMessage(input: OutboxMessageInput, index: number, ctx: PrepareContext): OutboxRow {
  const what = `outbox message [${index}]`;
  const parsed = OutboxMessageInput.safeParse(input);
  if (!parsed.success) throw new ValidationError(what, zodIssues(parsed.error, input));
  const m = parsed.data;
  const reserved = Object.keys(m.headers ?? {}).filter(isReservedHeader);
  if (reserved.length > 0) {
    throw new ValidationError(
      what,
      reserved.map((name) => ({
        path: `headers.${name}`,
        message: `is reserved: headers under "${RESERVED_PREFIX}" are Cairn's own (the relay sets them from the outbox row)`,
      })),
    );
  }
  const key = m.key ?? ctx.defaultKey;
  if (!key) {
    throw new ValidationError(what, [
      {
        path: 'key',
        message:
          'is required (a message needs a key to keep its order); pass key or enqueue through a task update',
      },
    ]);
  }
  let payload: Buffer;
  if (Buffer.isBuffer(m.payload)) {
    payload = m.payload;
  } else {
    if (m.payload === undefined)
      throw new ValidationError(what, [{ path: 'payload', message: 'is required' }]);
    const schema = ctx.schemas.get(m.topic);
    let value: unknown = m.payload;
    if (schema) {
      const r = schema.safeParse(m.payload);
      if (!r.success) {
        throw new ValidationError(
          `${what} payload for topic ${m.topic}`,
          zodIssues(r.error, m.payload).map((i) => ({ ...i, path: `payload.${i.path}` })),
        );
      }
      value = r.data;
    }
    payload = Buffer.from(JSON.stringify(value));
  }
  if (payload.length > ctx.maxPayloadBytes) {
    throw new ValidationError(what, [
      {
        path: 'payload',
        message: `is ${payload.length} bytes, over the limit of ${ctx.maxPayloadBytes}; store the content elsewhere and send a pointer`,
      },
    ]);
  }
  // The tenant and the task are part of the name: two tenants (or two tasks) using the same
  // idempotency key on a topic get two ids, so no inbox drops one as the other's duplicate.
  const messageId = m.idempotencyKey
    ? uuidv5(
        [ctx.tenantId ?? '', ctx.taskId ?? '', m.topic, m.idempotencyKey].join('\u0000'),
        MESSAGE_ID_NAMESPACE,
      )
    : uuidv7();
  const headers: Record<string, string> = { ...m.headers };
  if (m.traceparent) headers.traceparent = m.traceparent;
  // No trace context of the caller's: the active span's (a task update's, say) goes with the
  // message, so its consumer's span joins the trace. (With the API and a context manager but no
  // SDK, the active context is the one a handler received: it is passed on as it came.)
  // A caller that gave any trace header of its own (in any letter case) keeps exactly its own.
  const callersTrace = Object.keys(headers).some((h) => /^trace(parent|state)$/i.test(h));
  if (!callersTrace) Object.assign(headers, activeTraceHeaders());
  return {
    message_id: messageId,
    topic: m.topic,
    key,
    headers,
    payload,
    tenant_id: ctx.tenantId ?? null,
    task_id: ctx.taskId ?? null,
    task_version: ctx.taskVersion ?? null,
    task_seq: ctx.taskVersion !== undefined ? index : null,
  };
}
