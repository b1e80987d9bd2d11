import { sql } from 'kysely';
import type { Db } from '../../src/db/database.js';
import type { FailoverReport } from '../../src/recovery/failover.js';
import { workflowDigestOf } from '../../src/recovery/resume.js';
import { stateDigest } from '../../src/state/changelog.js';
import { type AuditEntry, replayAudit } from '../../src/state/replay.js';
import type { TaskStore } from '../../src/state/taskStore.js';
import { WORKFLOW_DEFINITION } from '../demo/workflow.js';
import type { RebuiltDigest } from './changelogReplay.js';
import { restart } from './pgCluster.js';

const WITNESSES = 3;

/**
 * Moves witness tasks through CAS updates (one message each) and remembers, per task, the
 * last version region A acknowledged: the ground truth for "no committed transition lost".
 */
export function startWitness(store: TaskStore, topic: string) {
  const acked = new Map<string, number>();
  let writes = 0;
  let stopping = false;
  const ids = Array.from({ length: WITNESSES }, (_, i) => `witness-${i}`);
  const ready = (async () => {
    for (const id of ids) {
      await store.create({
        task: {
          tenant_id: 'demo',
          task_id: id,
          intent_id: `witness-${id}`,
          workflow_digest: workflowDigestOf(WORKFLOW_DEFINITION),
          budget: { currency_committed_usd: 1, currency_spent_usd: 0, tokens_spent: 0, hops_used: 0 },
        },
        actor: 'spiffe://demo.cairn.local/witness',
      });
      acked.set(id, 1);
    }
  })();
  const loop = (async () => {
    await ready;
    for (let n = 0; !stopping; n++) {
      const id = ids[n % ids.length]!;
      const v = acked.get(id)!;
      const r = await store
        .update({
          taskId: id,
          expectedVersion: v,
          patch: { budget: { tokens_spent: n + 1 } },
          actor: 'spiffe://demo.cairn.local/witness',
          reason: 'witness write',
          messages: [{ topic, payload: { witness: id, n } }],
        })
        .catch(() => undefined);
      if (stopping) break; // an answer after the kill is not an acknowledgement we count on
      if (r?.ok) {
        acked.set(id, r.state.version);
        writes++;
      }
    }
  })();
  return {
    ready,
    acked,
    count: () => writes,
    stop: async () => {
      stopping = true;
      await loop;
    },
  };
}

export interface Snapshot {
  versions: Map<string, number>;
  inbox: Set<string>; // "group/message id"
  receipts: Set<string>; // idempotency keys of receipts in any state
}

export async function snapshot(
  q: (text: string) => Promise<Array<Record<string, unknown>>>,
): Promise<Snapshot> {
  const versions = new Map(
    (await q('SELECT task_id, version FROM task_state')).map(
      (r) => [String(r.task_id), Number(r.version)] as const,
    ),
  );
  const inbox = new Set(
    (await q('SELECT consumer_group, message_id FROM inbox')).map(
      (r) => `${r.consumer_group}/${r.message_id}`,
    ),
  );
  const receipts = new Set(
    (await q('SELECT idempotency_key FROM tool_receipt')).map((r) => String(r.idempotency_key)),
  );
  return { versions, inbox, receipts };
}

/**
 * Starts region A's data folder again (crash recovery, as a new server on a new port) and
 * compares it with what region B held at promotion: which tasks were really behind, and
 * whether every task held (by default the check's diverged tasks) had really lost a
 * transition, a consumption or a receipt. With `rebuilt` (what the changelog replay rebuilt,
 * as region B held it right after the replay): the tasks whose state digest at that version
 * differs from region A's, or that region A never had at that version.
 */
export async function regionATruth(
  root: string,
  b: Snapshot,
  report: FailoverReport,
  log: (line: string) => void,
  o: { held?: readonly string[]; rebuilt?: ReadonlyMap<string, RebuiltDigest> } = {},
): Promise<{ tasksBehind: string[]; falselyFlagged: string[]; digestMismatched: string[] }> {
  const a = await restart(root, 'region_a');
  try {
    const at = await snapshot((text) => a.query(text, 'cairn'));
    const behind = [...at.versions].filter(([id, v]) => (b.versions.get(id) ?? 0) < v).map(([id]) => id);
    const justified = new Set(behind);
    for (const c of report.lostConsumptions) {
      const k = `${c.groupId}/${c.messageId}`;
      if (at.inbox.has(k) && !b.inbox.has(k)) justified.add(c.taskId);
    }
    for (const m of report.missingReceipts) {
      if (m.taskId && at.receipts.has(m.idempotencyKey) && !b.receipts.has(m.idempotencyKey))
        justified.add(m.taskId);
    }
    // A message region A published that the mirror lacks is lost to region B whatever the
    // task's version (mirrorTruth checks against A's broker that each one really is missing):
    // its task is held for it, not flagged falsely.
    for (const u of report.unmirroredMessages) justified.add(u.taskId);
    const falselyFlagged = (o.held ?? report.divergedTasks).filter((id) => !justified.has(id));
    const digestMismatched = o.rebuilt?.size ? await mismatchedDigests(a, o.rebuilt) : [];
    log(
      `[failover] region A's own data: ${behind.length} tasks were ahead of region B at promotion` +
        (o.rebuilt
          ? `; ${o.rebuilt.size - digestMismatched.length} of ${o.rebuilt.size} rebuilt tasks match A's state digest`
          : ''),
    );
    return { tasksBehind: behind.sort(), falselyFlagged, digestMismatched };
  } finally {
    await a.stop();
  }
}

/**
 * Region A's document of each rebuilt task at the rebuilt version: its current one when A
 * stopped there, else its audit replayed up to that version (A may have committed more that
 * never reached the topic).
 */
async function mismatchedDigests(
  a: Awaited<ReturnType<typeof restart>>,
  rebuilt: ReadonlyMap<string, RebuiltDigest>,
): Promise<string[]> {
  const docs = new Map(
    (
      await a.query<{ task_id: string; version: number; doc: unknown }>(
        'SELECT task_id, version::int AS version, doc FROM task_state',
        'cairn',
      )
    ).map((r) => [r.task_id, r] as const),
  );
  const audit = new Map<string, AuditEntry[]>();
  for (const r of await a.query<AuditEntry & { task_id: string }>(
    'SELECT task_id, version::int AS version, prev_version::int AS prev_version, patch FROM task_audit ORDER BY task_id, version',
    'cairn',
  )) {
    const list = audit.get(r.task_id) ?? [];
    list.push(r);
    audit.set(r.task_id, list);
  }
  const bad: string[] = [];
  for (const [id, inB] of rebuilt) {
    const inA = docs.get(id);
    let digest: string | undefined;
    if (inA && Number(inA.version) === inB.version) digest = stateDigest(inA.doc);
    else if (inA && Number(inA.version) > inB.version) {
      try {
        digest = stateDigest(
          replayAudit((audit.get(id) ?? []).filter((e) => Number(e.version) <= inB.version)),
        );
      } catch {
        digest = undefined;
      }
    }
    if (digest !== inB.digest) bad.push(id);
  }
  return bad.sort();
}

/**
 * Held tasks changed since their hold (an audit row or a receipt started at or after it).
 * Not "since promotion": the changelog replay runs between the two, and a task it rebuilt in
 * part (up to the last record on the broker) that the check then still finds diverged (a later
 * message of it on the broker, its record not) is held with the replay's audit rows (and
 * restored receipts) written after the promotion (test/failover/heldTouchedByReplay.int).
 */
export async function heldTasksTouched(db: Db, held: readonly string[]): Promise<string[]> {
  const { rows } = await sql<{ task_id: string }>`
    SELECT DISTINCT x.task_id FROM (
      SELECT task_id, at FROM task_audit
      UNION ALL SELECT task_id, started_at FROM tool_receipt) x
      JOIN task_quarantine q ON q.task_id = x.task_id AND q.released_at IS NULL
     WHERE x.at >= q.placed_at AND x.task_id = ANY(${held}::text[])`.execute(db);
  return rows.map((r) => r.task_id);
}
