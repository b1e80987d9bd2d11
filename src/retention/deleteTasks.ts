import { sql } from 'kysely';
import { canonicalBytes, sha256 } from '../canonical.js';
import type { Trx } from '../db/executor.js';
import type { Candidate, DeletedTask } from './retention.js';

function isoOrText(at: unknown): string {
  return at instanceof Date && Number.isFinite(at.getTime()) ? at.toISOString() : String(at);
}

/** Counts and digests of everything a task holds, read inside the batch's transaction. */
export async function describe(trx: Trx, tenant: string, c: Candidate): Promise<DeletedTask> {
  const id = c.task_id;
  const mine = sql<boolean>`coalesce(tenant_id, ${tenant}) = ${tenant}`;
  const ofTenant = () => mine;
  const audit = await trx
    .selectFrom('task_audit')
    .select(['version', 'actor', 'reason', 'patch', 'at'])
    .where('task_id', '=', id)
    .where(ofTenant)
    .orderBy('version')
    .execute();
  const checkpoints = await trx
    .selectFrom('checkpoint')
    .select('digest')
    .where('task_id', '=', id)
    .where(ofTenant)
    .orderBy('seq')
    .execute();
  const receipts = await trx
    .selectFrom('tool_receipt')
    .select('result_digest')
    .where('task_id', '=', id)
    .where(ofTenant)
    .orderBy('started_at')
    .execute();
  const n = await sql<{
    snapshots: number;
    outbox: number;
    inbox: number;
    leases: number;
    annotations: number;
  }>`
    SELECT (SELECT count(*) FROM checkpoint_snapshot WHERE task_id = ${id} AND ${mine})::int AS snapshots,
           (SELECT count(*) FROM outbox WHERE key = ${id} AND (tenant_id = ${tenant} OR tenant_id IS NULL))::int AS outbox,
           (SELECT count(*) FROM inbox WHERE key = ${id} AND tenant_id = ${tenant})::int AS inbox,
           (SELECT count(*) FROM task_lease WHERE task_id = ${id} AND ${mine})::int AS leases,
           (SELECT count(*) FROM task_annotation WHERE task_id = ${id} AND ${mine})::int AS annotations`.execute(
    trx,
  );
  return {
    task_id: id,
    status: c.status,
    version: Number(c.version),
    data_class: c.data_class,
    state_digest: sha256(canonicalBytes(c.doc)),
    audit_rows: audit.length,
    // A time Postgres holds but a Date cannot ('infinity', written by a tenant's own SQL) is
    // digested as Postgres prints it: it must not fail the run.
    audit_digest: sha256(canonicalBytes(audit.map((a) => ({ ...a, at: isoOrText(a.at) })))),
    checkpoint_digests: checkpoints.map((x) => x.digest),
    receipts: receipts.length,
    receipt_result_digests: receipts.flatMap((x) => (x.result_digest ? [x.result_digest] : [])),
    ...n.rows[0]!,
  };
}

export async function deleteTasks(trx: Trx, tenant: string, ids: string[]): Promise<Record<string, number>> {
  const del = async (table: string, where: ReturnType<typeof sql>) =>
    Number((await sql`DELETE FROM ${sql.table(table)} WHERE ${where}`.execute(trx)).numAffectedRows ?? 0);
  // The tenant's rows only: another tenant may have left rows under the same id (its own SQL,
  // then its task deleted), which are not this tenant's to delete or certify.
  const byTask = sql`task_id = ANY(${ids}::text[]) AND coalesce(tenant_id, ${tenant}) = ${tenant}`;
  return {
    inbox: await del('inbox', sql`key = ANY(${ids}::text[]) AND tenant_id = ${tenant}`),
    // The newest version each group applied of the task's key (refuseStaleVersions): left, it
    // refused as stale every message of a task created again under the id (review).
    inbox_key_versions: await del(
      'inbox_key_version',
      sql`key = ANY(${ids}::text[]) AND tenant_id = ${tenant}`,
    ),
    // Never a message that has not reached the broker: such tasks were deferred (above).
    outbox: 0,
    receipts: await del('tool_receipt', byTask),
    leases: await del('task_lease', byTask),
    checkpoints: await del('checkpoint', byTask),
    snapshots: await del('checkpoint_snapshot', byTask),
    annotations: await del('task_annotation', byTask),
    audit_rows: await del('task_audit', byTask),
    tasks: await del('task_state', byTask),
  };
}
