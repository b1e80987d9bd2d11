import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { z } from 'zod';
import { canonicalBytes, sha256 } from '../canonical.js';
import type { Db } from '../db/database.js';
import type { Trx } from '../db/executor.js';
import { isDatabaseOutage, SqlState, sqlState } from '../db/sqlstate.js';
import { assertTenantKnown, lockTenantRow } from '../db/tenant.js';
import type { DataClass } from '../db/types.js';
import { messageOf, ValidationError } from '../errors.js';
import { opt, optionsSchema, parseOptions } from '../options.js';
import { deleteTasks, describe } from './deleteTasks.js';

export const DATA_CLASSES: readonly DataClass[] = ['public', 'internal', 'confidential'];

/**
 * How long a tenant keeps a finished task, by the most sensitive class of data its
 * checkpoints held (no checkpoint: internal). A class without a policy is kept forever.
 */
export async function setRetentionPolicy(
  db: Db,
  p: { tenantId: string; dataClass: string; retainDays: number },
): Promise<void> {
  if (!DATA_CLASSES.includes(p.dataClass as DataClass)) {
    throw new ValidationError('retention policy', [
      { path: 'class', message: `must be one of ${DATA_CLASSES.join(', ')}`, value: p.dataClass },
    ]);
  }
  if (!Number.isFinite(p.retainDays) || p.retainDays < 0) {
    throw new ValidationError('retention policy', [
      { path: 'days', message: 'must be a number of days >= 0', value: p.retainDays },
    ]);
  }
  await assertTenantKnown(db, p.tenantId);
  await db
    .insertInto('retention_policy')
    .values({ tenant_id: p.tenantId, data_class: p.dataClass as DataClass, retain_days: p.retainDays })
    .onConflict((c) =>
      c
        .columns(['tenant_id', 'data_class'])
        .doUpdateSet({ retain_days: p.retainDays, updated_at: new Date() }),
    )
    .execute();
}

export interface DeletedTask {
  task_id: string;
  status: string;
  version: number;
  data_class: DataClass;
  state_digest: string;
  audit_rows: number;
  audit_digest: string;
  checkpoint_digests: string[];
  snapshots: number;
  receipts: number;
  receipt_result_digests: string[];
  outbox: number;
  inbox: number;
  leases: number;
  annotations: number;
}

/**
 * A deletion certificate: what one batch of retention removed (counts and digests per task)
 * and the sha256 of that body.
 */
export interface Certificate {
  certificateId: string;
  runId: string;
  tenantId: string;
  body: {
    run_id: string;
    tenant_id: string;
    issued_by: string;
    policy: Partial<Record<DataClass, number>>;
    tasks: DeletedTask[];
    totals: Record<string, number>;
  };
  digest: string;
}

/**
 * What one retention run did: its certificates, the tasks deleted, held and deferred, and
 * totals per table.
 */
export interface RetentionRun {
  runId: string;
  dryRun: boolean;
  certificates: Certificate[];
  /** Expired tasks that were not deleted because a legal hold covers them. */
  held: string[];
  /**
   * Expired tasks deferred because a message of theirs has not reached the broker yet (the
   * relay is down, or the key is parked): a later run deletes them once it has.
   */
  deferred: string[];
  /**
   * Tenants whose part of the run failed (what the database refused, and why): the run goes on
   * with the next tenant, so one tenant's rows cannot keep another's expired data. An outage
   * of Postgres stops the whole run (thrown).
   */
  failed: Array<{ tenantId: string; error: string }>;
  /** Would be (dry run) or were deleted. */
  tasks: string[];
  totals: Record<string, number>;
}

/**
 * What runRetention takes: who runs it, for which tenant (default: every tenant with a
 * policy), the batch size and whether it is a dry run.
 */
export interface RetentionOptions {
  db: Db;
  actor: string;
  tenantId?: string;
  batchSize?: number;
  dryRun?: boolean;
}

/**
 * A named point where a test makes a batch fail. Internal: no entry point exports it; tests
 * reach it through `runRetentionWithTestHooks`.
 */
export interface RetentionTestHooks {
  /** Inside a batch's transaction after its deletes, before the certificate. */
  afterDeletes?(taskIds: string[]): void | Promise<void>;
}

const RetentionOptionsSchema = optionsSchema<RetentionOptions>()(
  z.strictObject({
    db: opt.db(),
    actor: opt.text(),
    tenantId: opt.text().optional(),
    batchSize: opt.count().optional(),
    dryRun: z.boolean().optional(),
  }),
);

export interface Candidate {
  task_id: string;
  status: string;
  version: number;
  doc: unknown;
  data_class: DataClass;
  held: boolean;
  unpublished: boolean;
}

/** Outbox rows of a task (by its column, or keyed by its id as rows before migration 0008 were). */
const unpublishedOf = (tenant: string, ids: readonly string[]) => sql`
  SELECT DISTINCT coalesce(o.task_id, o.key) AS task_id FROM outbox o
   WHERE (o.task_id = ANY(${ids}::text[]) OR (o.task_id IS NULL AND o.key = ANY(${ids}::text[])))
     AND coalesce(o.tenant_id, ${tenant}) = ${tenant}`;

/** Terminal tasks of `tenant` past their class's retention, oldest first. */
async function expired(db: Db | Trx, tenant: string, limit: number, exclude: string[]): Promise<Candidate[]> {
  const r = await sql<Candidate>`
    WITH t AS (
      SELECT s.task_id, s.tenant_id, s.status, s.version, s.doc, s.updated_at,
             coalesce((SELECT max(CASE c.data_class WHEN 'confidential' THEN 2 WHEN 'internal' THEN 1 ELSE 0 END)
                         FROM checkpoint c
                        WHERE c.task_id = s.task_id AND coalesce(c.tenant_id, s.tenant_id) = s.tenant_id), 1) AS rank
        FROM task_state s JOIN task_status st ON st.status = s.status AND st.terminal
       WHERE s.tenant_id = ${tenant} AND NOT (s.task_id = ANY(${exclude}::text[]))
    )
    SELECT t.task_id, t.status, t.version, t.doc, p.data_class, cairn_is_held(t.tenant_id, t.task_id) AS held,
           EXISTS (SELECT 1 FROM outbox o
                    WHERE (o.task_id = t.task_id OR (o.task_id IS NULL AND o.key = t.task_id))
                      AND coalesce(o.tenant_id, t.tenant_id) = t.tenant_id) AS unpublished
      FROM t JOIN retention_policy p
        ON p.tenant_id = t.tenant_id
       AND p.data_class = (CASE t.rank WHEN 2 THEN 'confidential' WHEN 1 THEN 'internal' ELSE 'public' END)
     WHERE t.updated_at < now() - p.retain_days * interval '1 day'
     ORDER BY t.updated_at, t.task_id
     LIMIT ${limit}`.execute(db);
  return r.rows;
}

/**
 * Deletes expired tasks with everything they hold (audit rows, checkpoints and snapshots,
 * receipts, leases, annotations, outbox and inbox rows), a batch per transaction, and
 * commits with each batch a deletion certificate: what was removed, counts and digests,
 * and the certificate's own sha256. Held tasks are skipped (and the database refuses to
 * delete them anyway). A failing batch rolls back whole: nothing is half-deleted.
 */
export async function runRetention(o: RetentionOptions): Promise<RetentionRun> {
  return runRetentionWithTestHooks(o, {});
}

/** Internal: `runRetention` with a hook at a named point, for tests. */
export async function runRetentionWithTestHooks(
  options: RetentionOptions,
  hooks: RetentionTestHooks,
): Promise<RetentionRun> {
  const o = parseOptions('retention options', RetentionOptionsSchema, options);
  const { db } = o;
  const batchSize = o.batchSize ?? 100;
  let tenants: string[];
  if (o.tenantId !== undefined) {
    await assertTenantKnown(db, o.tenantId);
    tenants = [o.tenantId];
  } else {
    tenants = (await db.selectFrom('retention_policy').select('tenant_id').distinct().execute()).map(
      (r) => r.tenant_id,
    );
  }
  const runId = randomUUID();
  const run: RetentionRun = {
    runId,
    dryRun: !!o.dryRun,
    certificates: [],
    held: [],
    deferred: [],
    failed: [],
    tasks: [],
    totals: {},
  };
  const add = (counts: Record<string, number>) => {
    for (const [k, v] of Object.entries(counts)) run.totals[k] = (run.totals[k] ?? 0) + v;
  };

  for (const tenant of tenants) {
    try {
      await retainTenant(tenant);
    } catch (err) {
      if (isDatabaseOutage(err)) throw err;
      run.failed.push({ tenantId: tenant, error: messageOf(err) });
    }
  }
  return run;

  async function retainTenant(tenant: string): Promise<void> {
    const policy = Object.fromEntries(
      (
        await db
          .selectFrom('retention_policy')
          .select(['data_class', 'retain_days'])
          .where('tenant_id', '=', tenant)
          .execute()
      ).map((p) => [p.data_class, Number(p.retain_days)]),
    );
    const skip: string[] = [];
    const refused = new Set<string>();
    for (;;) {
      const batch = await expired(db, tenant, batchSize, skip);
      const held = batch.filter((c) => c.held);
      run.held.push(...held.map((c) => c.task_id));
      run.deferred.push(...batch.filter((c) => !c.held && c.unpublished).map((c) => c.task_id));
      skip.push(...batch.map((c) => c.task_id)); // in a dry run (or after a refusal) move on
      const due = batch.filter((c) => !c.held && !c.unpublished);
      if (batch.length === 0) break;
      if (due.length === 0) continue;
      if (o.dryRun) {
        run.tasks.push(...due.map((c) => c.task_id));
        continue;
      }
      try {
        const cert = await db.transaction().execute(async (trx) => {
          await sql`SET LOCAL cairn.retention = 'on'`.execute(trx);
          // A row another transaction holds (a tenant's own lock on its task, lease or receipt)
          // is not waited for: the task is skipped (SKIP LOCKED), or the batch deferred (55P03).
          await sql`SET LOCAL lock_timeout = '2s'`.execute(trx);
          const chosen = due.map((c) => c.task_id);
          // The batch was chosen before this transaction: under the lock, only the rows that are
          // still the very documents chosen (terminal, same version and content) go. A task
          // deleted meanwhile (another run), or deleted and created again under its id, is not
          // this run's to delete or certify.
          const now = await sql<{ task_id: string; version: number; doc: unknown }>`
            SELECT s.task_id, s.version, s.doc FROM task_state s
              JOIN task_status st ON st.status = s.status AND st.terminal
             WHERE s.task_id = ANY(${chosen}::text[]) AND s.tenant_id = ${tenant}
               FOR UPDATE OF s SKIP LOCKED`.execute(trx);
          const same = new Set(
            now.rows
              .filter((r) => {
                const c = due.find((d) => d.task_id === r.task_id)!;
                return (
                  Number(r.version) === Number(c.version) &&
                  sha256(canonicalBytes(r.doc)) === sha256(canonicalBytes(c.doc))
                );
              })
              .map((r) => r.task_id),
          );
          const locked = chosen.filter((id) => same.has(id));
          // Held by another transaction (SKIP LOCKED): still there, for a later run.
          const busy = chosen.filter((id) => !now.rows.some((r) => r.task_id === id));
          if (busy.length > 0) {
            const still = await sql<{ task_id: string }>`
              SELECT task_id FROM task_state WHERE task_id = ANY(${busy}::text[]) AND tenant_id = ${tenant}`.execute(
              trx,
            );
            run.deferred.push(...still.rows.map((r) => r.task_id));
          }
          // Looked again under the lock: a message enqueued since the batch was chosen defers its task.
          const late = new Set(
            (await unpublishedOf(tenant, locked).execute(trx)).rows.map(
              (r) => (r as { task_id: string }).task_id,
            ),
          );
          run.deferred.push(...late);
          const ids = locked.filter((id) => !late.has(id));
          if (ids.length === 0) return undefined;
          // Holds being placed on this tenant or its tasks go first: a hold that commits before
          // this batch is seen by the delete's check, and one placed after waits for the batch.
          // The lock is the tenant's row (placeHold takes it FOR NO KEY UPDATE), which no
          // tenant's role can lock: an advisory lock, open to every role, let one tenant defer
          // another's retention for good (review finding, test/retention/oneTenant).
          await lockTenantRow(trx, tenant, 'deleting');
          const tasks: DeletedTask[] = [];
          for (const c of due) if (ids.includes(c.task_id)) tasks.push(await describe(trx, tenant, c));
          const deleted = await deleteTasks(trx, tenant, ids);
          await hooks.afterDeletes?.(ids);
          const body = {
            run_id: runId,
            tenant_id: tenant,
            issued_by: o.actor,
            policy,
            tasks,
            totals: deleted,
          };
          const certificate: Certificate = {
            certificateId: randomUUID(),
            runId,
            tenantId: tenant,
            body,
            digest: sha256(canonicalBytes(body)),
          };
          await trx
            .insertInto('deletion_certificate')
            .values({
              certificate_id: certificate.certificateId,
              run_id: runId,
              tenant_id: tenant,
              body: JSON.stringify(body),
              digest: certificate.digest,
            })
            .execute();
          return certificate;
        });
        if (!cert) continue;
        run.certificates.push(cert);
        run.tasks.push(...cert.body.tasks.map((t) => t.task_id));
        add(cert.body.totals);
      } catch (err) {
        // A row of the batch stayed locked: the batch rolled back whole, for a later run.
        if (sqlState(err) === SqlState.lockNotAvailable) {
          run.deferred.push(...due.map((c) => c.task_id));
          continue;
        }
        // A hold placed after the batch was chosen: the database refused, the batch rolled
        // back whole; the next pass no longer picks the held task. A batch refused a second
        // time (a hold the choice cannot see) is deferred: it was chosen again for ever.
        if (sqlState(err) !== SqlState.legalHold) throw err;
        const again = due.filter((c) => refused.has(c.task_id));
        if (again.length > 0) {
          run.deferred.push(...due.map((c) => c.task_id));
          continue;
        }
        for (const c of due) refused.add(c.task_id);
        skip.splice(skip.length - batch.length, batch.length);
      }
    }
  }
}

/** Recomputes a stored certificate's digest: true when its body is what was issued. */
export function certificateIntact(c: { body: unknown; digest: string }): boolean {
  return sha256(canonicalBytes(c.body)) === c.digest;
}
