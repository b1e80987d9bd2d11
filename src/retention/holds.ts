import { randomUUID } from 'node:crypto';
import type { Db } from '../db/database.js';
import { assertTenantKnown } from '../db/tenant.js';
import { NotFoundError, ValidationError } from '../errors.js';

export interface Hold {
  holdId: string;
  tenantId: string;
  taskId: string | null;
  reason: string;
  placedBy: string;
  placedAt: Date;
}

const required = (field: string, value: unknown): string => {
  if (typeof value !== 'string' || value.trim().length === 0) {
    throw new ValidationError('legal hold', [
      { path: field, message: 'is required and must not be empty', value },
    ]);
  }
  return value;
};

/**
 * Legal holds: while one is active on a task (or on its whole tenant), retention skips it and
 * the database refuses to delete its rows (trigger, SQLSTATE CN008). Released holds stay.
 */
export async function placeHold(
  db: Db,
  h: { tenantId?: string; taskId?: string; reason: string; actor: string },
): Promise<Hold> {
  const reason = required('reason', h.reason);
  const actor = required('actor', h.actor);
  let tenantId = h.tenantId;
  if (h.taskId !== undefined) {
    const task = await db
      .selectFrom('task_state')
      .select('tenant_id')
      .where('task_id', '=', h.taskId)
      .executeTakeFirst();
    if (!task) throw new NotFoundError('task', h.taskId);
    if (tenantId !== undefined && tenantId !== task.tenant_id) {
      throw new ValidationError('legal hold', [
        { path: 'tenant', message: `task ${h.taskId} belongs to tenant ${task.tenant_id}`, value: tenantId },
      ]);
    }
    tenantId = task.tenant_id;
  }
  if (tenantId === undefined) {
    throw new ValidationError('legal hold', [
      { path: 'task|tenant', message: 'name a task or a tenant to hold' },
    ]);
  }
  await assertTenantKnown(db, tenantId);
  const row = await db
    .insertInto('legal_hold')
    .values({
      hold_id: randomUUID(),
      tenant_id: tenantId,
      task_id: h.taskId ?? null,
      reason,
      placed_by: actor,
    })
    .returningAll()
    .executeTakeFirstOrThrow();
  return {
    holdId: row.hold_id,
    tenantId: row.tenant_id,
    taskId: row.task_id,
    reason: row.reason,
    placedBy: row.placed_by,
    placedAt: row.placed_at,
  };
}

/** Releases the active holds on exactly this task, or on exactly this tenant (task holds stay). */
export async function releaseHold(
  db: Db,
  h: { tenantId?: string; taskId?: string; actor: string },
): Promise<number> {
  const actor = required('actor', h.actor);
  if (h.taskId === undefined && h.tenantId === undefined) {
    throw new ValidationError('legal hold', [
      { path: 'task|tenant', message: 'name a task or a tenant to release' },
    ]);
  }
  let q = db
    .updateTable('legal_hold')
    .set({ released_at: new Date(), released_by: actor })
    .where('released_at', 'is', null);
  q = h.taskId !== undefined ? q.where('task_id', '=', h.taskId) : q.where('task_id', 'is', null);
  if (h.tenantId !== undefined) q = q.where('tenant_id', '=', h.tenantId);
  const r = await q.executeTakeFirst();
  return Number(r.numUpdatedRows);
}

export async function listHolds(db: Db, o: { tenantId?: string; all?: boolean } = {}): Promise<Hold[]> {
  let q = db.selectFrom('legal_hold').selectAll().orderBy('placed_at');
  if (!o.all) q = q.where('released_at', 'is', null);
  if (o.tenantId) q = q.where('tenant_id', '=', o.tenantId);
  return (await q.execute()).map((r) => ({
    holdId: r.hold_id,
    tenantId: r.tenant_id,
    taskId: r.task_id,
    reason: r.reason,
    placedBy: r.placed_by,
    placedAt: r.placed_at,
  }));
}

/**
 * A correction to a task's record, held or not: append-only (the table refuses UPDATE and
 * DELETE), with who and when. The task's own state and audit log are never rewritten.
 */
export async function annotate(db: Db, a: { taskId: string; author: string; body: string }): Promise<string> {
  const author = required('author', a.author);
  const body = required('body', a.body);
  const task = await db
    .selectFrom('task_state')
    .select('tenant_id')
    .where('task_id', '=', a.taskId)
    .executeTakeFirst();
  if (!task) throw new NotFoundError('task', a.taskId);
  const id = randomUUID();
  await db
    .insertInto('task_annotation')
    .values({ annotation_id: id, tenant_id: task.tenant_id, task_id: a.taskId, author, body })
    .execute();
  return id;
}
