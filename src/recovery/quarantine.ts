import type { Db } from '../db/database.js';
import type { Executor } from '../db/executor.js';

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

/** A task's hold after a failover, while it is not released: why and since when. */
export async function activeHold(
  db: Executor,
  taskId: string,
): Promise<{ reason: string; placed_at: Date } | undefined> {
  return db
    .selectFrom('task_quarantine')
    .select(['reason', 'placed_at'])
    .where('task_id', '=', taskId)
    .where('released_at', 'is', null)
    .executeTakeFirst();
}
