import { randomUUID } from 'node:crypto';
import type { Kafka } from 'kafkajs';
import pRetry from 'p-retry';
import { z } from 'zod';
import type { Db } from '../db/database.js';
import { UnavailableError } from '../errors.js';
import { connectOrUnavailable } from '../kafka/classifyError.js';
import { optionsSchema, parseOptions } from '../options.js';
import { HEADER } from '../outbox/wire.js';
import { lostConsumptionsOnMirror, type UnmirroredMessage, unmirroredMessages } from './failoverMirror.js';

export type { UnmirroredMessage } from './failoverMirror.js';

/** A transition the broker saw (a message it caused) that the database no longer has. */
export interface LostTransition {
  taskId: string;
  /** The version the database holds now; null if the task itself is gone. */
  storedVersion: number | null;
  /** The highest task version a published message carries. */
  seenVersion: number;
  topic: string;
  messageId: string;
}

/** An effect the tool reports as done of which the database holds no receipt at all. */
export interface MissingReceipt {
  idempotencyKey: string;
  taskId: string | null;
}

/** An effect the tool reports as applied (from its own records), and the task, if it knows. */
export interface AppliedEffect {
  idempotencyKey: string;
  taskId?: string;
}

/** A message a consumer group committed past whose inbox row the database does not have. */
export interface LostConsumption {
  groupId: string;
  taskId: string;
  topic: string;
  partition: number;
  offset: string;
  messageId: string;
}

/**
 * What checkAfterFailover found: transitions and consumptions the broker saw that the
 * database lost, effects without receipts, and the tasks to hold.
 */
export interface FailoverReport {
  lostTransitions: LostTransition[];
  lostConsumptions: LostConsumption[];
  missingReceipts: MissingReceipt[];
  /**
   * With `sourcePrefix` (a mirror): messages the database says were published that are neither
   * on the mirror nor in an inbox, published in the lost region and never mirrored. Empty otherwise.
   */
  unmirroredMessages: UnmirroredMessage[];
  /** Tasks to hold for an operator: resuming them could repeat or skip work. */
  divergedTasks: string[];
}

/** What checkAfterFailover compares the promoted database with. */
export interface FailoverCheckOptions {
  /** The topics the relay published to: every message on them is read to its end. */
  topics: readonly string[];
  /** Consumer groups whose committed offsets are checked against their inbox rows. */
  consumers?: ReadonlyArray<{ groupId: string; topics: readonly string[] }>;
  /** Effects the tool (or its log) reports as applied, if it can tell. */
  appliedEffects?: readonly AppliedEffect[];
  /**
   * The topics (and the groups' topics) are a mirror's, named `<sourcePrefix><source topic>`
   * (MirrorMaker 2's `A.` for a source cluster aliased A): consumptions are matched by message
   * id (the mirror's offsets are not the source's), and messages published but never mirrored
   * are looked for (see failoverMirror.ts).
   */
  sourcePrefix?: string;
}

const topicList = z.array(z.string().min(1)).readonly();
const FailoverCheckOptionsSchema = optionsSchema<FailoverCheckOptions>()(
  z.strictObject({
    topics: topicList,
    consumers: z
      .array(z.strictObject({ groupId: z.string().min(1), topics: topicList }).readonly())
      .readonly()
      .optional(),
    appliedEffects: z
      .array(z.strictObject({ idempotencyKey: z.string().min(1), taskId: z.string().optional() }))
      .readonly()
      .optional(),
    sourcePrefix: z.string().min(1).optional(),
  }),
);

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
  /** The payload, only when asked for (`values`). */
  value?: Buffer | null;
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
  const seen: SeenMessage[] = [];
  // No retries inside kafkajs: it would turn a retriable "not the leader" into a
  // non-retriable "retries exceeded" before the retry below could see it.
  const admin = kafka.admin({ retry: { retries: 0 } });
  await connectOrUnavailable(admin, 'the failover check');
  const remaining = new Map<string, bigint>(); // "topic/partition" -> last offset to read
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
      for (const p of offsets) {
        if (BigInt(p.high) > BigInt(p.low)) remaining.set(`${topic}/${p.partition}`, BigInt(p.high) - 1n);
      }
    }
  } finally {
    await admin.disconnect();
  }
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
          ...(opts.values ? { value: message.value } : {}),
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

/**
 * Messages each group committed past (on the broker) beyond the last one its inbox holds
 * in `db`: the transaction that consumed them committed in the lost region only.
 */
async function lostConsumptions(
  db: Db,
  kafka: Kafka,
  messages: readonly SeenMessage[],
  o: {
    consumers: ReadonlyArray<{ groupId: string; topics: readonly string[] }>;
    sourcePrefix: string | undefined;
  },
): Promise<LostConsumption[]> {
  const lost: LostConsumption[] = [];
  const admin = kafka.admin();
  await connectOrUnavailable(admin, 'the failover check');
  try {
    for (const c of o.consumers) {
      const committed = await admin.fetchOffsets({ groupId: c.groupId, topics: [...c.topics] });
      if (o.sourcePrefix !== undefined) {
        lost.push(...(await lostConsumptionsOnMirror(db, c.groupId, committed, messages)));
        continue;
      }
      const held = await db
        .selectFrom('inbox')
        .select(['topic', 'partition', (eb) => eb.fn.max('offset').as('offset')])
        .where('consumer_group', '=', c.groupId)
        .groupBy(['topic', 'partition'])
        .execute();
      const heldAt = new Map(held.map((h) => [`${h.topic}/${h.partition}`, BigInt(h.offset)]));
      for (const t of committed) {
        for (const p of t.partitions) {
          if (Number(p.offset) < 0) continue; // nothing committed yet
          const next = BigInt(p.offset);
          const from = (heldAt.get(`${t.topic}/${p.partition}`) ?? -1n) + 1n;
          for (const m of messages) {
            const o = BigInt(m.offset);
            if (m.topic === t.topic && m.partition === p.partition && o >= from && o < next) {
              if (!m.taskId) continue; // a message no task change caused: nothing to hold
              lost.push({
                groupId: c.groupId,
                taskId: m.taskId,
                topic: m.topic,
                partition: m.partition,
                offset: m.offset,
                messageId: m.messageId,
              });
            }
          }
        }
      }
    }
  } finally {
    await admin.disconnect();
  }
  return lost;
}

/**
 * Run on the promoted database after a regional failover, before anything resumes: compares
 * what the database holds with what the outside world already saw. With asynchronous
 * replication the last transactions of the lost region may be missing; a message on the
 * broker carrying a task version the database does not have, a message a consumer group
 * committed past without an inbox row here, or an effect the tool applied whose receipt is
 * missing, shows exactly that. Those tasks are reported as diverged so that
 * nothing resumes them silently into a repeated or skipped step.
 *
 * `appliedEffects`: what the tool (or its log) reports as applied, if it can tell; effects are
 * otherwise guarded by receipts and the tool's own idempotency keys.
 *
 * `sourcePrefix`: the promoted region reads its own cluster, a MirrorMaker 2 mirror of the
 * lost region's. A message published there but not yet mirrored is invisible here like an
 * unreplicated commit; when the database lacks its transition as well, the loss cannot be seen
 * from this region at all, and when it has it, the task is held (`unmirroredMessages`).
 */
export async function checkAfterFailover(
  db: Db,
  kafka: Kafka,
  options: FailoverCheckOptions,
): Promise<FailoverReport> {
  const o = parseOptions('failover check options', FailoverCheckOptionsSchema, options);
  const messages = await readTopicsToEnd(kafka, o.topics);
  // The task a message's transition belongs to is its cairn-task-id with its tenant (never its
  // key: a message may be keyed by anything, and two tenants may use the same key).
  const seen = new Map<
    string,
    { taskId: string; tenant: string | null; version: number; topic: string; messageId: string }
  >();
  for (const m of messages) {
    if (!m.taskId || m.version === null) continue;
    const id = `${m.tenant ?? ''}\u0000${m.taskId}`;
    if (m.version > (seen.get(id)?.version ?? 0)) {
      seen.set(id, {
        taskId: m.taskId,
        tenant: m.tenant,
        version: m.version,
        topic: m.topic,
        messageId: m.messageId,
      });
    }
  }
  const taskIds = [...new Set([...seen.values()].map((s) => s.taskId))];
  const stored = new Map<string, number>(
    taskIds.length === 0
      ? []
      : (
          await db
            .selectFrom('task_state')
            .select(['task_id', 'tenant_id', 'version'])
            .where('task_id', 'in', taskIds)
            .execute()
        ).map((r) => [`${r.tenant_id}\u0000${r.task_id}`, r.version]),
  );
  const tenantOf = new Map([...stored.keys()].map((k) => [k.split('\u0000')[1]!, k.split('\u0000')[0]!]));
  const lostTransitions: LostTransition[] = [];
  for (const [id, { tenant, ...s }] of seen) {
    // A task that exists under another tenant is not this message's: never hold it for a lie.
    const owner = tenantOf.get(s.taskId);
    if (owner !== undefined && owner !== (tenant ?? '')) continue;
    const v = stored.get(id) ?? null;
    if (v === null || v < s.version) {
      lostTransitions.push({ storedVersion: v, seenVersion: s.version, ...s });
    }
  }
  const applied = o.appliedEffects ?? [];
  const keys = [...new Set(applied.map((a) => a.idempotencyKey))];
  const known = new Set(
    keys.length === 0
      ? []
      : (
          await db
            .selectFrom('tool_receipt')
            .select('idempotency_key')
            .where('idempotency_key', 'in', keys)
            .execute()
        ).map((r) => r.idempotency_key),
  );
  const missingReceipts: MissingReceipt[] = [];
  const consumed = await lostConsumptions(db, kafka, messages, {
    consumers: o.consumers ?? [],
    sourcePrefix: o.sourcePrefix,
  });
  const unmirrored =
    o.sourcePrefix === undefined
      ? []
      : await unmirroredMessages(
          db,
          messages,
          (o.consumers ?? []).map((c) => c.groupId),
        );
  const diverged = new Set([...lostTransitions, ...consumed, ...unmirrored].map((l) => l.taskId));
  for (const a of applied) {
    // A receipt in any state means the database knows of the effect: a started or uncertain
    // one is the ordinary crash that resume's reconcile settles. Only a missing row is a loss.
    if (known.has(a.idempotencyKey)) continue;
    const taskId = a.taskId ?? null;
    missingReceipts.push({ idempotencyKey: a.idempotencyKey, taskId });
    if (taskId) diverged.add(taskId);
  }
  lostTransitions.sort((a, b) => a.taskId.localeCompare(b.taskId));
  return {
    lostTransitions,
    lostConsumptions: consumed,
    missingReceipts,
    unmirroredMessages: unmirrored,
    divergedTasks: [...diverged].sort(),
  };
}

/**
 * Quarantines tasks (after `checkAfterFailover`): until released, their state cannot change
 * and no new side effect can start for them (triggers, SQLSTATE CN009): agents that get
 * their messages fail them to the dead-letter topic instead of redoing or skipping work.
 */
export async function quarantine(
  db: Db,
  taskIds: readonly string[],
  o: { reason: string; actor: string },
): Promise<number> {
  if (taskIds.length === 0) return 0;
  const r = await db
    .insertInto('task_quarantine')
    .values(taskIds.map((task_id) => ({ task_id, reason: o.reason, placed_by: o.actor })))
    .onConflict((c) => c.column('task_id').where('released_at', 'is', null).doNothing())
    .executeTakeFirst();
  return Number(r.numInsertedOrUpdatedRows ?? 0);
}

/**
 * Releases a task's quarantine (recording who did it); returns how many holds were released
 * (0 or 1). `tenantId` releases only a quarantine recorded for that tenant (null: one
 * recorded for no tenant, as for a task the failover found gone), so an operator acting for a
 * tenant cannot release another's.
 */
export async function releaseQuarantine(
  db: Db,
  taskId: string,
  actor: string,
  opts: { tenantId?: string | null } = {},
): Promise<number> {
  let q = db
    .updateTable('task_quarantine')
    .set({ released_at: new Date(), released_by: actor })
    .where('task_id', '=', taskId)
    .where('released_at', 'is', null);
  if (opts.tenantId !== undefined) {
    q = opts.tenantId === null ? q.where('tenant_id', 'is', null) : q.where('tenant_id', '=', opts.tenantId);
  }
  const r = await q.executeTakeFirst();
  return Number(r.numUpdatedRows);
}
