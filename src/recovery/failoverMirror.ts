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
import { TERMINAL } from '../state/transitions.js';
import type { LostConsumption, SeenMessage } from './failover.js';

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
 */
export async function lostConsumptionsOnMirror(
  db: Db,
  groupId: string,
  committed: ReadonlyArray<{
    topic: string;
    partitions: ReadonlyArray<{ partition: number; offset: string }>;
  }>,
  messages: readonly SeenMessage[],
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
  return past
    .filter((m) => !held.has(key(m.tenant, m.messageId)))
    .map((m) => ({
      groupId,
      taskId: m.taskId!,
      topic: m.topic,
      partition: m.partition,
      offset: m.offset,
      messageId: m.messageId,
    }));
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
