/**
 * The wire contract: the headers Cairn puts on every message it publishes, what each means,
 * and who sets it. Every `cairn-*` header is Cairn's: a caller cannot pass one (prepareMessage
 * refuses it, and the outbox's CHECK refuses a row that stores one), and the relay builds
 * them from the outbox row's columns, which row-level security and triggers keep honest
 * (tenant_id is the writer's tenant, task_id a task of that tenant). Consumers trust these
 * headers and nothing else a producer wrote.
 */

import { CairnError, CairnErrorCodes } from '../errors.js';

/**
 * The `cairn-*` headers the relay puts on every message, from the outbox row's columns:
 * what each means and who sets it is docs/wire.md.
 */
export const HEADER = {
  /** The message id (outbox.message_id): what inboxes deduplicate on, per tenant. */
  messageId: 'cairn-message-id',
  /** The tenant whose row the message is (outbox.tenant_id). */
  tenant: 'cairn-tenant',
  /** The task whose change caused the message (outbox.task_id). */
  taskId: 'cairn-task-id',
  /** The task version that change committed (outbox.task_version). */
  taskVersion: 'cairn-task-version',
  /** The message's place among the messages of that one change, from 0 (outbox.task_seq). */
  taskSeq: 'cairn-task-seq',
} as const;

/**
 * The headers an inbox consumer adds when it sends a message it could not apply to
 * `<topic>.dlq` (beside the original's headers, `cairn-message-id` kept): where it came from
 * and why it failed, so `cairn inbox replay` and an operator can find it again.
 */
export const DLQ_HEADER = {
  /** The handler's error message, cut at 2,000 characters. */
  error: 'cairn-dlq-error',
  /** The consumer group that gave up on it. */
  consumerGroup: 'cairn-dlq-consumer-group',
  /** The topic it was read from. */
  originalTopic: 'cairn-dlq-original-topic',
  /** Its partition there. */
  originalPartition: 'cairn-dlq-original-partition',
  /** Its offset there. */
  originalOffset: 'cairn-dlq-original-offset',
  /** How many attempts failed before it was dead-lettered. */
  attempts: 'cairn-dlq-attempts',
} as const;

/** Headers under this prefix are Cairn's alone (the dead-letter headers `cairn-dlq-*` too). */
export const RESERVED_PREFIX = 'cairn-';

export function isReservedHeader(name: string): boolean {
  return name.toLowerCase().startsWith(RESERVED_PREFIX);
}

export interface WireColumns {
  message_id: string;
  tenant_id: string | null;
  task_id: string | null;
  task_version: number | null;
  task_seq: number | null;
}

/**
 * The headers to publish for an outbox row: the caller's own (which must be an object of
 * strings without a `cairn-*` name: throws BadRowError naming the header otherwise, for a
 * row written by hand past the CHECK) and Cairn's, from the row's columns.
 */
export function wireHeaders(stored: unknown, row: WireColumns): Record<string, string> {
  if (stored === null || typeof stored !== 'object' || Array.isArray(stored)) {
    throw new BadRowError(
      row.message_id,
      `headers are ${Array.isArray(stored) ? 'an array' : typeof stored}, not an object`,
    );
  }
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(stored)) {
    if (isReservedHeader(name)) continue; // rows from before migration 0008 stored Cairn's own
    if (typeof value !== 'string') {
      throw new BadRowError(
        row.message_id,
        `header ${JSON.stringify(name)} is ${value === null ? 'null' : typeof value}, not a string`,
      );
    }
    out[name] = value;
  }
  out[HEADER.messageId] = row.message_id;
  if (row.tenant_id) out[HEADER.tenant] = row.tenant_id;
  if (row.task_id) out[HEADER.taskId] = row.task_id;
  if (row.task_version !== null) out[HEADER.taskVersion] = String(row.task_version);
  if (row.task_seq !== null) out[HEADER.taskSeq] = String(row.task_seq);
  return out;
}

/** An outbox row that can never be published as it is (its key is parked, others flow). */
export class BadRowError extends CairnError {
  constructor(messageId: string, what: string) {
    super(CairnErrorCodes.UnpublishableRow, `outbox message ${messageId} cannot be published: ${what}`);
  }
}
