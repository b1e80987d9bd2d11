import { sql } from 'kysely';
import { z } from 'zod';
import { canonicalBytes, sha256 } from '../canonical.js';
import { type KeyRing, type Signature, signBytes, verifyBytes } from '../checkpoints/signing.js';
import { hasDataKey, type TenantKeys } from '../crypto/tenantKeys.js';
import type { Executor } from '../db/executor.js';
import { CairnError, ValidationError } from '../errors.js';
import type { OutboxRow } from '../outbox/message.js';
import type { Outbox } from '../outbox/outbox.js';

/**
 * The changelog (issue 20): for every committed task version, one record on a Kafka topic,
 * written to the outbox in the transaction of the change, complete enough to rebuild the
 * change in a region that lost it (src/recovery/replayChangelog.ts). What a record holds and
 * who can forge one is docs/changelog.md.
 */

/** The default topic of the changelog. */
export const CHANGELOG_TOPIC = 'cairn.changelog';
export const CHANGELOG_FORMAT = 'cairn.changelog.v1';

/**
 * The topic's configuration for `admin.createTopics` (kafkajs ITopicConfig). Every record is
 * kept for `keepAllMs` (default 7 days: the window in which a region may have to replay), then
 * compaction keeps the latest record per task (the key), and `retentionMs` (default 30 days)
 * deletes what is older still. A replay that needs a record compacted away finds a gap, and
 * the task is held as before, never rebuilt wrong.
 */
export function changelogTopicConfig(o: {
  topic?: string;
  numPartitions?: number;
  replicationFactor?: number;
  keepAllMs?: number;
  retentionMs?: number;
}): {
  topic: string;
  numPartitions: number;
  replicationFactor?: number;
  configEntries: Array<{ name: string; value: string }>;
} {
  const day = 24 * 3600 * 1000;
  const keepAll = o.keepAllMs ?? 7 * day;
  const retention = o.retentionMs ?? 30 * day;
  if (retention < keepAll) {
    throw new ValidationError('changelog topic config', [
      { path: 'retentionMs', message: `is shorter than keepAllMs (${keepAll})`, value: retention },
    ]);
  }
  return {
    topic: o.topic ?? CHANGELOG_TOPIC,
    numPartitions: o.numPartitions ?? 6,
    ...(o.replicationFactor === undefined ? {} : { replicationFactor: o.replicationFactor }),
    configEntries: [
      { name: 'cleanup.policy', value: 'compact,delete' },
      { name: 'min.compaction.lag.ms', value: String(keepAll) },
      { name: 'retention.ms', value: String(retention) },
    ],
  };
}

/** What a TaskStore's `changelog` option takes. */
export interface ChangelogOptions {
  /** The topic (default `cairn.changelog`). */
  topic?: string;
  /**
   * Signs every record (HMAC-SHA256, like checkpoints): a replay with the ring refuses a
   * record it did not sign. Without it, whoever can write the outbox can forge records of
   * its own tenant's tasks.
   */
  keyRing?: KeyRing;
  /**
   * Tenant data keys: a record of a tenant that has a data key is encrypted with it (bound
   * to its tenant, task and version). Defaults to the store's `keys`.
   */
  keys?: TenantKeys;
}

/** A message the transition enqueued: replay checks it reached the broker. */
export interface ChangelogMessage {
  id: string;
  topic: string;
  key: string;
}

/** A receipt of the task as it stood when the transition committed (no result: its digest only). */
export interface ChangelogReceipt {
  receipt_id: string;
  idempotency_key: string;
  step: string;
  tool: string;
  args_digest: string;
  status: string;
  attempt: number;
  irreversible: boolean;
  worker: string;
  result_digest: string | null;
  /** The result as the receipt stores it: JSON, or ciphertext (base64) under the tenant's key. */
  result: unknown;
  result_enc: string | null;
  result_key_id: string | null;
}

/** The inbox message whose handler made the transition, if it was made in one. */
export interface ConsumedMessage {
  consumer_group: string;
  message_id: string;
  topic: string;
  partition: number;
  offset: string;
  key: string | null;
}

/** What a record says about one transition (the body, encrypted when the tenant has a key). */
export interface ChangelogBody {
  actor: string;
  reason: string | null;
  /** RFC 6902, from the previous stored document to this one (as the audit row's). */
  patch: unknown[];
  /** sha256 of the canonical stored document before and after: the chain between records. */
  prev_state_sha256: string | null;
  state_sha256: string;
  status: string;
  schema_version: string;
  messages: ChangelogMessage[];
  receipts: ChangelogReceipt[];
  consumed: ConsumedMessage | null;
}

/** The record on the topic: who and which version in the clear, the body plain or sealed. */
export interface ChangelogEnvelope {
  format: typeof CHANGELOG_FORMAT;
  tenant_id: string;
  task_id: string;
  version: number;
  prev_version: number | null;
  body?: ChangelogBody;
  sealed?: { key_id: string; ciphertext: string };
  /**
   * No body: the record would have been over the outbox's payload limit. The change is not
   * refused for it; a replay finds this version unprovable and holds the task.
   */
  omitted?: { reason: 'too_large'; bytes: number };
  signature?: Signature;
}

export const ChangelogEnvelopeSchema = z.strictObject({
  format: z.literal(CHANGELOG_FORMAT),
  tenant_id: z.string().min(1),
  task_id: z.string().min(1),
  version: z.number().int().min(1),
  prev_version: z.number().int().min(1).nullable(),
  body: z.record(z.string(), z.unknown()).optional(),
  sealed: z.strictObject({ key_id: z.string().min(1), ciphertext: z.string() }).optional(),
  omitted: z.strictObject({ reason: z.literal('too_large'), bytes: z.number().int() }).optional(),
  signature: z
    .strictObject({ alg: z.literal('HMAC-SHA256'), key_id: z.string().min(1), value: z.string() })
    .optional(),
});

export const ChangelogBodySchema = z.strictObject({
  actor: z.string().min(1),
  reason: z.string().nullable(),
  patch: z.array(z.record(z.string(), z.unknown())),
  prev_state_sha256: z.string().nullable(),
  state_sha256: z.string(),
  status: z.string(),
  schema_version: z.string(),
  messages: z.array(z.strictObject({ id: z.string(), topic: z.string(), key: z.string() })),
  receipts: z.array(
    z.strictObject({
      receipt_id: z.uuid(),
      idempotency_key: z.string(),
      step: z.string(),
      tool: z.string(),
      args_digest: z.string(),
      status: z.string(),
      attempt: z.number().int(),
      irreversible: z.boolean(),
      worker: z.string(),
      result_digest: z.string().nullable(),
      result: z.unknown(),
      result_enc: z.string().nullable(),
      result_key_id: z.string().nullable(),
    }),
  ),
  consumed: z
    .strictObject({
      consumer_group: z.string(),
      message_id: z.string(),
      topic: z.string(),
      partition: z.number().int(),
      offset: z.string(),
      key: z.string().nullable(),
    })
    .nullable(),
});

/** The digest a record names for a stored document (the chain and the check after a replay). */
export const stateDigest = (storedDoc: unknown) => sha256(canonicalBytes(storedDoc));

/** What a record is bound to when sealed (a ciphertext moved to another record does not open). */
export const changelogAad = (e: Pick<ChangelogEnvelope, 'tenant_id' | 'task_id' | 'version'>) =>
  `${CHANGELOG_FORMAT}/${e.tenant_id}/${e.task_id}/${e.version}`;

/** The bytes a record's signature covers: the canonical envelope without its signature. */
export function envelopeBytes(e: ChangelogEnvelope): Buffer {
  const { signature: _s, ...unsigned } = e;
  return canonicalBytes(unsigned);
}

export function verifyEnvelope(e: ChangelogEnvelope, ring: KeyRing | undefined) {
  return verifyBytes(envelopeBytes(e), e.signature, ring, 'changelog record');
}

// The inbox consumer names the message a handler runs for on the handler's transaction, so a
// transition made in it records what it consumed (and a replay restores the inbox row).
const consumedIn = new WeakMap<object, { m: ConsumedMessage | null; records: string[] }>();

/**
 * The header the inbox consumer puts on every changelog record its handler wrote for one
 * message: how many there were. A replay restores the message's inbox row only when it
 * rebuilt that many (a handler that changed two tasks, one of whose records was lost, has not
 * been replayed whole: its message must stay unapplied, or its loss would be hidden).
 */
export const CONSUMED_RECORDS_HEADER = 'changelog-records-of-consumption';

/** A transaction's consumption mark: which message its handler is applying now. */
export interface ConsumptionMark {
  /** From now on, records written in the transaction name `m` (until the next `applying`). */
  applying(m: ConsumedMessage): void;
  /**
   * After the handler, in the transaction: stamps the records written for the current message
   * with how many there were; undefined when there were none (most messages: no promise).
   */
  finish(): Promise<void> | undefined;
  /** Ends the mark. */
  clear(): void;
}

/**
 * Marks `trx` as the transaction applying inbox messages (consumers/inboxConsumer.ts), one
 * mark for all the messages of a chunk, moved on with `applying` before each handler: one
 * WeakMap entry per transaction, not per message.
 */
export function consumptionMark(trx: Executor): ConsumptionMark {
  const mark: { m: ConsumedMessage | null; records: string[] } = { m: null, records: [] };
  consumedIn.set(trx, mark);
  return {
    applying(m) {
      mark.m = m;
      if (mark.records.length > 0) mark.records = [];
    },
    finish() {
      if (mark.records.length === 0) return undefined;
      return sql`
        UPDATE outbox SET headers = headers || jsonb_build_object(${CONSUMED_RECORDS_HEADER}::text, ${String(mark.records.length)}::text)
         WHERE message_id = ANY(${`{${mark.records.join(',')}}`}::uuid[])`
        .execute(trx)
        .then(() => undefined);
    },
    clear: () => consumedIn.delete(trx),
  };
}

/** The transition a TaskStore is about to commit, as the changelog needs it. */
export interface Transition {
  tenantId: string;
  taskId: string;
  version: number;
  prevVersion: number | null;
  actor: string;
  reason: string | null;
  patch: unknown[];
  prevStored: unknown | null;
  /** stateDigest(prevStored), when the caller knows it already (its previous write's). */
  prevDigest?: string;
  nextStored: { status: string; schema_version: string };
  messages: readonly OutboxRow[];
}

/** Writes a transition's record to the outbox, in the transaction `t` of the change. */
export interface ChangelogWriter {
  readonly topic: string;
  /** Returns the new state's digest (the next record's `prev_state_sha256`). */
  write(t: Executor, tr: Transition): Promise<string>;
}

export function createChangelogWriter(o: ChangelogOptions, outbox: Outbox): ChangelogWriter {
  const topic = o.topic ?? CHANGELOG_TOPIC;
  return {
    topic,
    async write(t, tr) {
      const nextDigest = stateDigest(tr.nextStored);
      const body: ChangelogBody = {
        actor: tr.actor,
        reason: tr.reason,
        patch: tr.patch,
        prev_state_sha256: tr.prevStored === null ? null : (tr.prevDigest ?? stateDigest(tr.prevStored)),
        state_sha256: nextDigest,
        status: tr.nextStored.status,
        schema_version: tr.nextStored.schema_version,
        messages: tr.messages.map((m) => ({ id: m.message_id, topic: m.topic, key: m.key })),
        receipts: tr.prevVersion === null ? [] : await receiptsOf(t, tr.taskId, tr.prevVersion),
        consumed: consumedIn.get(t)?.m ?? null,
      };
      const envelope: ChangelogEnvelope = {
        format: CHANGELOG_FORMAT,
        tenant_id: tr.tenantId,
        task_id: tr.taskId,
        version: tr.version,
        prev_version: tr.prevVersion,
        ...(await sealed(o.keys, t, tr, body)),
      };
      const ctx = { taskId: tr.taskId, taskVersion: tr.version, tenantId: tr.tenantId };
      const prepare = (e: ChangelogEnvelope) => {
        if (o.keyRing) e.signature = signBytes(envelopeBytes(e), o.keyRing);
        const payload = Buffer.from(JSON.stringify(e));
        // One record per version: written again (a retried transaction) it keeps its id.
        const message = { topic, key: tr.taskId, idempotencyKey: `v${tr.version}`, payload };
        return { row: outbox.prepare([message], ctx)[0]!, bytes: payload.length };
      };
      let row: OutboxRow;
      try {
        ({ row } = prepare(envelope));
      } catch (err) {
        // Over the payload limit: the change goes through; its record says it has no body.
        if (!(err instanceof ValidationError && err.issues.some((i) => i.path === 'payload'))) throw err;
        const { body: _b, sealed: _s, signature: _g, ...head } = envelope;
        const bytes = Buffer.byteLength(JSON.stringify(envelope));
        ({ row } = prepare({ ...head, omitted: { reason: 'too_large', bytes } }));
      }
      await outbox.insert(t, [{ ...row, task_seq: tr.messages.length }]);
      consumedIn.get(t)?.records.push(row.message_id);
      return nextDigest;
    },
  };
}

async function sealed(
  keys: TenantKeys | undefined,
  t: Executor,
  tr: Transition,
  body: ChangelogBody,
): Promise<Pick<ChangelogEnvelope, 'body' | 'sealed'>> {
  if (!keys) return { body };
  try {
    const s = await keys.seal(
      tr.tenantId,
      canonicalBytes(body),
      changelogAad({ tenant_id: tr.tenantId, task_id: tr.taskId, version: tr.version }),
      t,
    );
    return { sealed: { key_id: s.keyId, ciphertext: s.bytes.toString('base64') } };
  } catch (err) {
    // A tenant with no data key (never given one) has nothing the database encrypts either.
    // key_missing also says a key-encryption key is not in this process's provider (a keyring
    // read before a rotation): the tenant has a data key then, and the change is refused, not
    // written in the clear (review).
    if (err instanceof CairnError && err.code === 'key_missing' && !(await hasDataKey(t, tr.tenantId)))
      return { body };
    throw err;
  }
}

/**
 * The task's receipts that may have changed since its previous version: every one not settled
 * for good (started, uncertain, compensating, gated: moving among these sets no finished_at,
 * and a gate after the previous version was in no record), and the ones settled since that
 * version committed. A handful per task (index tool_receipt_task).
 */
async function receiptsOf(t: Executor, taskId: string, prevVersion: number): Promise<ChangelogReceipt[]> {
  const r = await sql<ChangelogReceipt>`
    SELECT receipt_id, idempotency_key, step, tool, args_digest, status, attempt, irreversible,
           worker, result_digest, result, encode(result_enc, 'base64') AS result_enc, result_key_id
      FROM tool_receipt r
     WHERE r.task_id = ${taskId}
       AND (r.status NOT IN ('succeeded', 'failed', 'compensated') OR r.finished_at IS NULL
            OR r.finished_at >= (SELECT at FROM task_audit a WHERE a.task_id = ${taskId} AND a.version = ${prevVersion}))
     ORDER BY r.started_at, r.receipt_id`.execute(t);
  return r.rows;
}
