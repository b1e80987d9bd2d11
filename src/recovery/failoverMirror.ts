/**
 * The failover check against a mirror (a second region's own Kafka cluster fed by MirrorMaker
 * 2): the topics are read as the mirror names them (`A.<topic>`), while the database's inbox
 * and outbox name the source topics and hold the source cluster's offsets.
 *
 * A message published in the lost region but not yet mirrored is invisible here, exactly like a
 * commit that was not replicated: the broker the promoted region can reach never saw it. If the
 * database also lacks the transition that sent it, nothing the promoted region holds shows the
 * loss (only the lost region's own broker or data would). If the database has the transition,
 * its checkpoints at that version name the message as pending work; a message that is neither
 * still in the outbox, nor on the mirror, nor in any inbox was published where it can no longer
 * be read, and the task would wait for it forever: it is reported, and its task held.
 */
import { sql } from 'kysely';
import type { Db } from '../db/database.js';
import type { KafkaAdmin } from '../kafka/admin.js';
import { TERMINAL } from '../state/transitions.js';
import type { LostConsumption } from './failover.js';
import type { SeenMessage } from './readTopics.js';
import { deletedByRetention, retentionKey } from './retentionDeleted.js';

/** Clocks of the relay's host (record timestamps) and the database (applied_at) may disagree by this much. */
const PRUNE_CLOCK_MARGIN_MS = 60_000;
/** The inbox consumers' default retention (consumers/inboxConsumer.ts `retentionMs`). */
const DEFAULT_INBOX_RETENTION_MS = 7 * 24 * 3600 * 1000;

/** A group's partitions of a mirror topic that hold messages but no translated offset of the group. */
export interface GroupNotJudged {
  groupId: string;
  topic: string;
  partitions: number[];
}

/**
 * Every topic the check is told to read on a mirror must be named `<prefix><source topic>`:
 * an unprefixed name is this region's own topic (where its relay publishes after the
 * failover), and judging it as the mirror would take this region's messages for the lost
 * region's. Returns the issues, each naming its field and value.
 */
export function mirrorTopicIssues(
  prefix: string,
  topics: readonly string[],
  consumers: ReadonlyArray<{ groupId: string; topics: readonly string[] }>,
): Array<{ path: string; message: string; value: string }> {
  const bad = (t: string) => !t.startsWith(prefix) || t.length === prefix.length;
  const message = `must be a mirror topic named ${prefix}<source topic> (sourcePrefix is ${JSON.stringify(prefix)}); name the mirrored topic, or leave sourcePrefix out on a shared broker`;
  return [
    ...topics.flatMap((t, i) => (bad(t) ? [{ path: `topics.${i}`, message, value: t }] : [])),
    ...consumers.flatMap((c, i) =>
      c.topics.flatMap((t, j) => (bad(t) ? [{ path: `consumers.${i}.topics.${j}`, message, value: t }] : [])),
    ),
  ];
}

/** The source names of `topics` (prefix removed) that exist on this cluster: this region's own topics. */
export async function localTopicsOfMirror(
  admin: KafkaAdmin,
  prefix: string,
  topics: readonly string[],
): Promise<string[]> {
  const exists = new Set(await admin.listTopics());
  return [...new Set(topics.map((t) => t.slice(prefix.length)))].filter((t) => exists.has(t));
}

/** A message the database says was published (its outbox row is gone) that the mirror lacks. */
export interface UnmirroredMessage {
  taskId: string;
  messageId: string;
  /** The task version whose checkpoint names the message. */
  version: number;
}

/**
 * Messages the group committed past on the mirror whose inbox row the database lacks. The
 * mirror's offsets are not the source's (MirrorMaker translates committed offsets through its
 * offset syncs, and conservatively: a translated offset may lag the source's), so messages are
 * matched by their message id, not by offset. A lag only hides a loss from this check; a
 * message the group is re-delivered is dropped by the inbox as already applied.
 *
 * The mirror keeps a topic's whole retained history, older than anything the database still
 * holds: a message of a task that retention deleted here (its inbox rows went with it; a
 * deletion certificate names it and the task is gone) is not a loss and is not reported.
 * Nor is a message whose row pruning may have removed: inbox pruning (consumers/sql/pruneInbox.ts)
 * deletes rows older than the consumers' retention (`inboxRetentionMs`, default 7 days), so a
 * message older than that and than the group's oldest row kept (by its record timestamp, less
 * a minute for clocks) is not judged. Both bounds: a row the changelog replay restored is
 * stamped with the replay's time (a record timestamp is the producer's to choose: an old one
 * had the row pruned right after the replay and the message applied again, a future one moved
 * the horizon past the losses), so the oldest row alone could put the horizon after every
 * loss it is there to find. A group with no inbox row left is judged whole.
 */
export async function lostConsumptionsOnMirror(
  db: Db,
  groupId: string,
  committed: ReadonlyArray<{
    topic: string;
    partitions: ReadonlyArray<{ partition: number; offset: string }>;
  }>,
  messages: readonly SeenMessage[],
  inboxRetentionMs = DEFAULT_INBOX_RETENTION_MS,
): Promise<LostConsumption[]> {
  const next = new Map(
    committed.flatMap((t) =>
      t.partitions
        .filter((p) => Number(p.offset) >= 0)
        .map((p) => [`${t.topic}/${p.partition}`, BigInt(p.offset)] as const),
    ),
  );
  const past = messages.filter((m) => {
    const n = next.get(`${m.topic}/${m.partition}`);
    return m.taskId !== null && n !== undefined && BigInt(m.offset) < n;
  });
  if (past.length === 0) return [];
  // Message ids are unique per tenant: a row of another tenant with the same id is not this one.
  // One array parameter, however many messages the group passed (one per id would stop at 65,535).
  const key = (tenant: string | null, id: string) => `${tenant ?? ''}\u0000${id}`;
  const { rows } = await sql<{ tenant_id: string | null; message_id: string }>`
    SELECT tenant_id, message_id FROM inbox
     WHERE consumer_group = ${groupId} AND message_id = ANY(${past.map((m) => m.messageId)}::text[])`.execute(
    db,
  );
  const held = new Set(rows.map((r) => key(r.tenant_id, r.message_id)));
  const oldest = await sql<{ at: Date | null }>`
    SELECT min(applied_at) AS at FROM inbox WHERE consumer_group = ${groupId}`.execute(db);
  const horizon = oldest.rows[0]?.at
    ? Math.min(oldest.rows[0].at.getTime(), Date.now() - inboxRetentionMs) - PRUNE_CLOCK_MARGIN_MS
    : null;
  const missing = past.filter(
    (m) =>
      !held.has(key(m.tenant, m.messageId)) &&
      (horizon === null || m.timestamp === undefined || Number(m.timestamp) >= horizon),
  );
  const gone = await goneByRetention(db, missing);
  return missing
    .filter((m) => {
      const at = gone.get(retentionKey(m.tenant, m.taskId!));
      return at === undefined || (m.version !== null && m.version > at);
    })
    .map((m) => ({
      groupId,
      taskId: m.taskId!,
      topic: m.topic,
      partition: m.partition,
      offset: m.offset,
      messageId: m.messageId,
    }));
}

/** Of the messages' tasks, those absent here that a deletion certificate names (with the version deleted at). */
async function goneByRetention(db: Db, messages: readonly SeenMessage[]): Promise<Map<string, number>> {
  if (messages.length === 0) return new Map();
  const ids = [...new Set(messages.map((m) => m.taskId!))];
  const { rows } = await sql<{ tenant_id: string; task_id: string }>`
    SELECT tenant_id, task_id FROM task_state WHERE task_id = ANY(${ids}::text[])`.execute(db);
  const present = new Set(rows.map((r) => retentionKey(r.tenant_id, r.task_id)));
  return deletedByRetention(
    db,
    messages
      .map((m) => ({ tenant: m.tenant, taskId: m.taskId! }))
      .filter((t) => !present.has(retentionKey(t.tenant, t.taskId))),
  );
}

/**
 * Messages the database's last transition of a live task sent (named by the checkpoints taken at
 * that version), no longer queued in its outbox, that are neither on the mirror nor in an inbox
 * of one of `groups` (the consumer groups the operator named): published in the lost region and
 * never mirrored. Every checkpoint at the task's version counts, not only the latest: one taken
 * later at the same version (a deploy's, say) was taken after the relay had published the
 * message and no longer names it. Every match is by tenant and id (ids are unique per tenant).
 *
 * Not judged: tasks without a checkpoint at their version (a store without a checkpointer, a
 * transition that passed no boundary), whose pending messages are not known here. An inbox row
 * of a group that was not named (an observer's) does not count as delivered.
 */
export async function unmirroredMessages(
  db: Db,
  seen: readonly SeenMessage[],
  groups: readonly string[] = [],
): Promise<UnmirroredMessage[]> {
  const rows = await sql<{ task_id: string; tenant_id: string; version: number; message_id: string }>`
    SELECT DISTINCT s.task_id, s.tenant_id, s.version, w.value->>'message_id' AS message_id
      FROM task_state s
      JOIN checkpoint cp ON cp.task_id = s.task_id AND cp.state_version = s.version
      CROSS JOIN LATERAL jsonb_array_elements(cp.doc->'pending_work') w
     WHERE NOT (s.status::text = ANY(${[...TERMINAL]}::text[]))
       AND w.value ? 'message_id'
       AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.message_id::text = w.value->>'message_id'
                         AND coalesce(o.tenant_id, '') = s.tenant_id)
       AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.message_id = w.value->>'message_id'
                         AND coalesce(i.tenant_id, '') = s.tenant_id
                         AND i.consumer_group = ANY(${[...groups]}::text[]))`.execute(db);
  const onMirror = new Set(seen.map((m) => `${m.tenant ?? ''}\u0000${m.messageId}`));
  return rows.rows
    .filter((r) => !onMirror.has(`${r.tenant_id}\u0000${r.message_id}`))
    .map((r) => ({ taskId: r.task_id, messageId: r.message_id, version: r.version }))
    .sort((a, b) => a.taskId.localeCompare(b.taskId) || a.messageId.localeCompare(b.messageId));
}
