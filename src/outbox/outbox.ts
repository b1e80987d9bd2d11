import { sql } from 'kysely';
import { z } from 'zod';
import type { Executor } from '../db/executor.js';
import { LeaseLostError } from '../errors.js';
import { type Fence, holdsFence } from '../leases/sql/fenceCheck.js';
import { objectWith, optionsSchema, parseOptions, refuseUnknownKeys } from '../options.js';
import { laneOf } from './lanes.js';
import {
  DEFAULT_MAX_PAYLOAD_BYTES,
  type OutboxMessageInput,
  type OutboxRow,
  prepareMessage,
} from './message.js';

/**
 * Writes messages in the caller's transaction, so that they are published if and only if it
 * commits.
 */
export interface Outbox {
  /**
   * Validates messages and turns them into rows, without writing: throws ValidationError
   * naming the message and field. For callers that must refuse bad input before they open
   * their transaction; `insert` writes the result.
   */
  prepare(messages: readonly OutboxMessageInput[], ctx?: EnqueueContext): OutboxRow[];
  /** Writes prepared rows inside the caller's transaction; returns their message ids. */
  insert(trx: Executor, rows: readonly OutboxRow[]): Promise<string[]>;
  /**
   * Inserts messages inside the caller's transaction: they exist (and will be published)
   * if and only if that transaction commits. Returns the message ids, in order.
   */
  enqueue(trx: Executor, messages: readonly OutboxMessageInput[], ctx?: EnqueueContext): Promise<string[]>;
}

/**
 * Where enqueued messages come from: the lease they rely on, their default key, and the
 * task change (id, version, tenant) they belong to.
 */
export interface EnqueueContext {
  /** Refuse (LeaseLostError) unless this lease is still current; checked in the same transaction. */
  lease?: Fence;
  defaultKey?: string;
  taskId?: string;
  taskVersion?: number;
  tenantId?: string;
}

const ENQUEUE_CONTEXT_KEYS = [
  'lease',
  'defaultKey',
  'taskId',
  'taskVersion',
  'tenantId',
] as const satisfies readonly (keyof EnqueueContext)[];

/** The channel `notify` signals and relays with `wakeOnNotify` listen on. */
export const OUTBOX_CHANNEL = 'cairn_outbox';

/** What createOutbox takes. */
export interface OutboxOptions {
  /** zod schema per topic; a JSON payload for that topic must match it. */
  schemas?: Record<string, z.ZodType>;
  maxPayloadBytes?: number;
  /**
   * Also `NOTIFY cairn_outbox` in the enqueuing transaction, for relays started with
   * `wakeOnNotify`. Costs commit throughput (see README); polling alone is the default.
   */
  notify?: boolean;
  /**
   * Write each message to the WAL only (a logical decoding message, migration 0019), not as a
   * row of the outbox table: nothing for Postgres to store, claim, delete or vacuum. Needs a
   * relay in WAL mode reading this database (its slot registered: else the write is refused,
   * 55000, rather than lost) and the right to write WAL messages taken from every role but the
   * outbox's owner (the relay checks and names the statement). The slot is then the only copy
   * of a message until the broker acked it: see docs/relay-modes.md for what that means at a
   * regional failover. Off by default.
   */
  walMessages?: boolean;
}

const OutboxOptionsSchema = optionsSchema<OutboxOptions>()(
  z.strictObject({
    schemas: z.record(z.string(), objectWith<z.ZodType>('a zod schema', 'safeParse')).optional(),
    maxPayloadBytes: z.number().int().positive().optional(),
    notify: z.boolean().optional(),
    walMessages: z.boolean().optional(),
  }),
);

/**
 * Makes an Outbox. It holds no connection of its own (it writes with the executor each call
 * is given), so it has nothing to close.
 */
export function createOutbox(input: OutboxOptions = {}): Outbox {
  const options = parseOptions('outbox options', OutboxOptionsSchema, input);
  const schemas = new Map(Object.entries(options.schemas ?? {}));
  const maxPayloadBytes = options.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD_BYTES;
  const outbox: Outbox = {
    prepare(messages, ctx = {}) {
      refuseUnknownKeys('enqueue context', ctx, ENQUEUE_CONTEXT_KEYS, { fence: 'lease' });
      return messages.map((m, i) => prepareMessage(m, i, { ...ctx, schemas, maxPayloadBytes }));
    },
    async enqueue(trx, messages, ctx = {}) {
      if (messages.length === 0) return [];
      // Validate everything before writing anything: a bad message refuses the whole call.
      const rows = outbox.prepare(messages, ctx);
      if (ctx.lease && !(await holdsFence(trx, ctx.lease))) {
        throw new LeaseLostError(
          `outbox: lease ${ctx.lease.taskId}/${ctx.lease.branch} with fencing token ${ctx.lease.fencingToken} ` +
            'is no longer current; nothing was enqueued',
        );
      }
      return outbox.insert(trx, rows);
    },
    async insert(trx, rows) {
      if (rows.length === 0) return [];
      const columns = (r: OutboxRow) => ({
        message_id: r.message_id,
        tenant_id: r.tenant_id,
        task_id: r.task_id,
        task_version: r.task_version,
        task_seq: r.task_seq,
        topic: r.topic,
        key: r.key,
        headers: JSON.stringify(r.headers),
        payload: r.payload,
      });
      if (options.walMessages) await trx.insertInto('outbox_wal').values(rows.map(columns)).execute();
      else {
        await trx
          .insertInto('outbox')
          .values(rows.map((r) => ({ lane: laneOf(r.key), ...columns(r) })))
          .execute();
      }
      if (options.notify) await sql`SELECT pg_notify(${OUTBOX_CHANNEL}, '')`.execute(trx);
      return rows.map((r) => r.message_id);
    },
  };
  return outbox;
}
