import { randomUUID } from 'node:crypto';
import { v5 as uuidv5 } from 'uuid';
import type { Db } from '../db/database.js';
import { assertTenantKnown, lockTenantRow } from '../db/tenant.js';
import { CairnError, NotFoundError, ValidationError } from '../errors.js';

/**
 * A legal hold on a task or a whole tenant: while active, retention skips its data and the
 * database refuses to delete it.
 */
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
): Promise<Hold & { created: boolean }> {
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
  const tenant = tenantId;
  // Placing the same hold again (an operator repeating the command, or rerunning it after it
  // was killed) returns the active hold instead of adding a second one.
  const row = await db.transaction().execute(async (trx) => {
    // The tenant's row, locked against retention batches (which take it FOR SHARE from before
    // their deletes until they commit) and against another placement of this hold: the hold
    // waits for a batch, and a task the batch deleted is then not found, rather than held in
    // name while its rows are gone. No tenant's role can lock this row (no UPDATE on it).
    await lockTenantRow(trx, tenant, 'holding');
    if (h.taskId !== undefined) {
      const still = await trx
        .selectFrom('task_state')
        .select('task_id')
        .where('task_id', '=', h.taskId)
        .executeTakeFirst();
      if (!still) throw new NotFoundError('task', h.taskId);
    }
    let existing = trx
      .selectFrom('legal_hold')
      .selectAll()
      .where('tenant_id', '=', tenant)
      .where('reason', '=', reason)
      .where('released_at', 'is', null);
    existing =
      h.taskId !== undefined
        ? existing.where('task_id', '=', h.taskId)
        : existing.where('task_id', 'is', null);
    const found = await existing.executeTakeFirst();
    if (found) return { ...found, created: false };
    const placed = await trx
      .insertInto('legal_hold')
      .values({
        hold_id: randomUUID(),
        tenant_id: tenant,
        task_id: h.taskId ?? null,
        reason,
        placed_by: actor,
      })
      .returningAll()
      .executeTakeFirstOrThrow();
    return { ...placed, created: true };
  });
  return {
    created: row.created,
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

/** The active legal holds (every hold with `all`), of one tenant or of all. */
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

const ANNOTATION_NAMESPACE = 'a4e2d3c1-6b5f-4f0e-9d8c-7b6a5e4d3c2b';

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
  // The same correction by the same author is one annotation: its id comes from what it says,
  // so running the command again (or after it was killed) adds nothing.
  const id = uuidv5(`${a.taskId}\u0000${author}\u0000${body}`, ANNOTATION_NAMESPACE);
  await db
    .insertInto('task_annotation')
    .values({ annotation_id: id, tenant_id: task.tenant_id, task_id: a.taskId, author, body })
    .onConflict((c) => c.column('annotation_id').doNothing())
    .execute();
  // The id is predictable: a row already under it must be this very correction, not one a
  // tenant planted there to have the operator's dropped.
  const stored = await db
    .selectFrom('task_annotation')
    .select(['task_id', 'author', 'body'])
    .where('annotation_id', '=', id)
    .executeTakeFirstOrThrow();
  if (stored.task_id !== a.taskId || stored.author !== author || stored.body !== body) {
    throw new CairnError(
      'annotation_conflict',
      `annotation ${id} of task ${a.taskId} already exists with another author or text: the correction was not recorded; report it`,
    );
  }
  return id;
}
