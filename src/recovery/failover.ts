import { z } from 'zod';
import type { Db } from '../db/database.js';
import { ValidationError } from '../errors.js';
import type { KafkaAdmin } from '../kafka/admin.js';
import { optionsSchema, parseOptions } from '../options.js';
import {
  type GroupNotJudged,
  localTopicsOfMirror,
  lostConsumptionsOnMirror,
  mirrorTopicIssues,
  type UnmirroredMessage,
  unmirroredMessages,
} from './failoverMirror.js';
import {
  type EndOffsets,
  endOffsets,
  type GroupCommits,
  groupOffsets,
  type MovedPartition,
  movedCommits,
  readTopicsSnapshot,
  type SeenMessage,
} from './readTopics.js';
import { deletedByRetention, retentionKey } from './retentionDeleted.js';

export type { GroupNotJudged, UnmirroredMessage } from './failoverMirror.js';
export { quarantine, releaseQuarantine } from './quarantine.js';
export { type MovedPartition, readTopicsToEnd, type SeenMessage } from './readTopics.js';

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
  /**
   * With `sourcePrefix`: a group's topic partitions that hold messages on the mirror but for
   * which the group has no translated offset here (MirrorMaker never wrote its checkpoint to
   * this cluster): what the group consumed there was not judged at all, which is not "nothing
   * lost". Empty otherwise (on a shared broker a group without an offset consumed nothing).
   */
  groupsNotJudged: GroupNotJudged[];
  /**
   * Partitions whose end offset moved while the check ran (MirrorMaker still copying, or a
   * relay still publishing): a message that arrived after the check's snapshot may be reported
   * as not mirrored, or a loss missed. Non-empty: do not act on the report; stop what writes
   * to the topics and run the check again.
   */
  movedDuringCheck: MovedPartition[];
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
   * are looked for (see failoverMirror.ts). Every topic named (in `topics` and in each group's
   * `topics`) must start with it, or the check refuses to run (ValidationError): an unprefixed
   * name is this region's own topic, not the mirror. This region's own topics (the source
   * names, where this region's relay publishes after the failover) are read as well when they
   * exist, so that a message published here is not taken for one never mirrored.
   */
  sourcePrefix?: string;
  /**
   * With `sourcePrefix`: how long inbox rows are kept here: the shortest `retentionMs` of the
   * named groups' consumers (each prunes its own group's rows; `cairn inbox prune` prunes every
   * group's; default 7 days, the consumers' default). Only a message older than that (and than the group's oldest row kept)
   * may be missing because pruning removed its row; a younger one missing is a loss. Set too
   * long, the check holds tasks whose rows were pruned (released with `cairn failover release`).
   */
  inboxRetentionMs?: number;
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
    inboxRetentionMs: z.number().int().positive().optional(),
  }),
);

/**
 * Messages each group committed past (on the broker) beyond the last one its inbox holds
 * in `db`: the transaction that consumed them committed in the lost region only. On a mirror,
 * also the group partitions that could not be judged (no translated offset).
 */
async function lostConsumptions(
  db: Db,
  messages: readonly SeenMessage[],
  o: {
    consumers: ReadonlyArray<{ groupId: string; topics: readonly string[] }>;
    sourcePrefix: string | undefined;
    inboxRetentionMs: number | undefined;
    ends: EndOffsets;
    /** The groups' offsets, read before the topics (the check's snapshot). */
    commits: GroupCommits;
  },
): Promise<{ lost: LostConsumption[]; notJudged: GroupNotJudged[] }> {
  const lost: LostConsumption[] = [];
  const notJudged: GroupNotJudged[] = [];
  for (const c of o.consumers) {
    const committed = o.commits.get(c.groupId) ?? [];
    if (o.sourcePrefix !== undefined) {
      lost.push(...(await lostConsumptionsOnMirror(db, c.groupId, committed, messages, o.inboxRetentionMs)));
      // A partition the mirror holds messages on, without a translated offset: MirrorMaker
      // never checkpointed the group there (or not yet). Nothing here says what it consumed.
      for (const t of committed) {
        const partitions = t.partitions
          .filter((p) => Number(p.offset) < 0)
          .filter((p) => {
            const e = o.ends.get(`${t.topic}/${p.partition}`);
            return e !== undefined && e.high > e.low;
          })
          .map((p) => p.partition)
          .sort((a, b) => a - b);
        if (partitions.length > 0) notJudged.push({ groupId: c.groupId, topic: t.topic, partitions });
      }
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
  return { lost, notJudged };
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
  kafka: KafkaAdmin,
  options: FailoverCheckOptions,
): Promise<FailoverReport> {
  const o = parseOptions('failover check options', FailoverCheckOptionsSchema, options);
  if (o.sourcePrefix !== undefined) {
    const issues = mirrorTopicIssues(o.sourcePrefix, o.topics, o.consumers ?? []);
    if (issues.length > 0) throw new ValidationError('failover check options', issues);
  }
  // With a mirror, this region's own topics (the source names) too, where exist: after the
  // failover this region's relay publishes there, and a message it published is no loss.
  const local =
    o.sourcePrefix === undefined ? [] : await localTopicsOfMirror(kafka, o.sourcePrefix, o.topics);
  // The groups' offsets first, then the topics' ends: one snapshot, compared at the end.
  const commits = await groupOffsets(kafka, o.consumers ?? []);
  const { messages: all, ends } = await readTopicsSnapshot(kafka, [...o.topics, ...local]);
  const localSet = new Set(local);
  const messages = all.filter((m) => !localSet.has(m.topic));
  // The task a message's transition belongs to is its cairn-task-id with its tenant (never its
  // key: a message may be keyed by anything, and two tenants may use the same key).
  const seen = new Map<
    string,
    { taskId: string; tenant: string | null; version: number; topic: string; messageId: string }
  >();
  for (const m of all) {
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
  // A task retention deleted here (a deletion certificate names it, at a version at least the
  // message's) is gone on purpose: its messages outlive it on the topic until the topic's own
  // retention drops them.
  const deleted = await deletedByRetention(
    db,
    [...seen.entries()].filter(([id]) => !stored.has(id)).map(([, s]) => s),
  );
  for (const [id, { tenant, ...s }] of seen) {
    // A task that exists under another tenant is not this message's: never hold it for a lie.
    const owner = tenantOf.get(s.taskId);
    if (owner !== undefined && owner !== (tenant ?? '')) continue;
    const v = stored.get(id) ?? null;
    if (v === null && (deleted.get(retentionKey(tenant, s.taskId)) ?? -1) >= s.version) continue;
    if (v === null || v < s.version) {
      lostTransitions.push({ storedVersion: v, seenVersion: s.version, ...s });
    }
  }
  const applied = o.appliedEffects ?? [];
  const keys = [...new Set(applied.map((a) => a.idempotencyKey))];
  // By key and task: a key alone may be another tenant's row (any tenant may write a receipt
  // under any key for a task of its own), which would hide this effect's lost receipt (review).
  const receiptRows =
    keys.length === 0
      ? []
      : await db
          .selectFrom('tool_receipt')
          .select(['idempotency_key', 'task_id'])
          .where('idempotency_key', 'in', keys)
          .execute();
  const known = new Set(receiptRows.map((r) => r.idempotency_key));
  const knownForTask = new Set(receiptRows.map((r) => `${r.task_id}\u0000${r.idempotency_key}`));
  const missingReceipts: MissingReceipt[] = [];
  const { lost: consumed, notJudged } = await lostConsumptions(db, messages, {
    consumers: o.consumers ?? [],
    sourcePrefix: o.sourcePrefix,
    inboxRetentionMs: o.inboxRetentionMs,
    ends,
    commits,
  });
  const unmirrored =
    o.sourcePrefix === undefined
      ? []
      : await unmirroredMessages(
          db,
          all,
          (o.consumers ?? []).map((c) => c.groupId),
        );
  // Read again last: anything copied or published since the snapshot may have been judged
  // missing above (a message MirrorMaker copied after it is reported as never mirrored).
  const after = await endOffsets(kafka, [...o.topics, ...local], 60_000);
  const movedDuringCheck: MovedPartition[] = [];
  for (const [id, a] of after) {
    const before = ends.get(id)?.high ?? 0n;
    if (a.high === before) continue;
    const cut = id.lastIndexOf('/');
    movedDuringCheck.push({
      topic: id.slice(0, cut),
      partition: Number(id.slice(cut + 1)),
      before: String(before),
      after: String(a.high),
    });
  }
  movedDuringCheck.push(...movedCommits(commits, await groupOffsets(kafka, o.consumers ?? [])));
  const diverged = new Set([...lostTransitions, ...consumed, ...unmirrored].map((l) => l.taskId));
  for (const a of applied) {
    // A receipt in any state means the database knows of the effect: a started or uncertain
    // one is the ordinary crash that resume's reconcile settles. Only a missing row is a loss.
    if (a.taskId ? knownForTask.has(`${a.taskId}\u0000${a.idempotencyKey}`) : known.has(a.idempotencyKey))
      continue;
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
    groupsNotJudged: notJudged,
    movedDuringCheck,
    divergedTasks: [...diverged].sort(),
  };
}
