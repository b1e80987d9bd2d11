/**
 * Holding what the failover check found, so that running the check again is safe: an operator
 * who released a task (`cairn failover release`) decided about exactly what the check had
 * found for it; the same findings again are not news and the task stays released. Anything
 * new found for it (another lost message, transition, consumption or receipt) holds it again.
 *
 * What was found is the quarantine's reason: a short summary for a reader and the sha256 of
 * every finding for the task, so that "the same" is a comparison of reasons and nothing else
 * has to be stored.
 */
import { sql } from 'kysely';
import { canonicalBytes, sha256 } from '../canonical.js';
import type { Db } from '../db/database.js';
import type { FailoverReport } from './failover.js';

/** What holdDiverged did: tasks it quarantined, and tasks it left released (nothing new found). */
export interface HoldResult {
  held: string[];
  keptReleased: string[];
}

/** Each diverged task's findings, each one line, sorted (stable whatever order the check found them in). */
export function findingsByTask(r: FailoverReport): Map<string, string[]> {
  const by = new Map<string, string[]>();
  const add = (taskId: string, line: string) => {
    const l = by.get(taskId) ?? [];
    l.push(line);
    by.set(taskId, l);
  };
  for (const l of r.lostTransitions) add(l.taskId, `transition v${l.seenVersion} ${l.messageId}`);
  for (const c of r.lostConsumptions) add(c.taskId, `consumption ${c.groupId} ${c.messageId}`);
  for (const u of r.unmirroredMessages) add(u.taskId, `unmirrored v${u.version} ${u.messageId}`);
  for (const m of r.missingReceipts) if (m.taskId) add(m.taskId, `receipt ${m.idempotencyKey}`);
  for (const l of by.values()) l.sort();
  return by;
}

/** The quarantine reason for a task's findings: a short summary and the digest of all of them. */
export function holdReason(prefix: string, findings: readonly string[]): string {
  const shown = findings.slice(0, 3).join(', ');
  const more = findings.length > 3 ? ` and ${findings.length - 3} more` : '';
  return `${prefix}: ${shown}${more} (findings ${sha256(canonicalBytes([...findings]))})`;
}

/**
 * Quarantines the report's diverged tasks, except a task whose released quarantine had the
 * same reason (the same findings): the operator already decided about those. A task already
 * held stays held as it is.
 */
export async function holdDiverged(
  db: Db,
  report: FailoverReport,
  o: { actor: string; reason?: string },
): Promise<HoldResult> {
  const by = findingsByTask(report);
  const ids = report.divergedTasks;
  if (ids.length === 0) return { held: [], keptReleased: [] };
  const reasons = ids.map((id) => holdReason(o.reason ?? 'failover check: lost work', by.get(id) ?? []));
  const released = new Set(
    (
      await sql<{ task_id: string }>`
        SELECT DISTINCT q.task_id FROM task_quarantine q
          JOIN unnest(${ids}::text[], ${reasons}::text[]) AS x(task_id, reason)
            ON q.task_id = x.task_id AND q.reason = x.reason
         WHERE q.released_at IS NOT NULL`.execute(db)
    ).rows.map((r) => r.task_id),
  );
  const todo = ids.map((id, i) => ({ id, reason: reasons[i]! })).filter((t) => !released.has(t.id));
  if (todo.length === 0) return { held: [], keptReleased: [...released].sort() };
  const held = await db
    .insertInto('task_quarantine')
    .values(todo.map((t) => ({ task_id: t.id, reason: t.reason, placed_by: o.actor })))
    .onConflict((c) => c.column('task_id').where('released_at', 'is', null).doNothing())
    .returning('task_id')
    .execute();
  return { held: held.map((h) => h.task_id).sort(), keptReleased: [...released].sort() };
}
