import { sql } from 'kysely';
import { type DeadLetter, listDeadLetters } from '../consumers/deadLetters.js';
import type { Checkpointer } from '../src/checkpoints/checkpoints.js';
import type { Db } from '../src/db/database.js';
import { listParked, type ParkedKey } from '../src/outbox/operator.js';
import { listHolds } from '../src/retention/holds.js';
import { STATUSES } from '../src/schemas/taskState.js';
import { createTaskStore } from '../src/state/taskStore.js';

/**
 * What the console's pages read. Every read of tenant data goes through `scoped`: the
 * operator's own tenant's connection (row-level security), or the owner's for a user bound to
 * no tenant. Only tables that are no tenant's (relay lanes, parked keys, pg_stat) are read
 * as the owner, filtered by the operator's tenant where they carry one.
 */
export interface Scope {
  /** Reads of tenant data: bound by row-level security when `tenant` is set. */
  db: Db;
  /** The owner's connection, for what no tenant owns. */
  owner: Db;
  tenant?: string;
}

export interface TaskFilter {
  status?: string;
  tenant?: string;
  quarantined?: boolean;
  held?: boolean;
}

export interface TaskListRow {
  task_id: string;
  tenant_id: string;
  version: number;
  status: string;
  updated_at: Date;
  quarantined: boolean;
  held: boolean;
}

const activeQuarantine = sql<boolean>`EXISTS (SELECT 1 FROM task_quarantine q
  WHERE q.task_id = t.task_id AND q.released_at IS NULL)`;
const activeHold = sql<boolean>`EXISTS (SELECT 1 FROM legal_hold h WHERE h.released_at IS NULL
  AND h.tenant_id = t.tenant_id AND (h.task_id IS NULL OR h.task_id = t.task_id))`;

/** The newest tasks first, at most `limit`, filtered. */
export async function listTasks(s: Scope, f: TaskFilter, limit = 200): Promise<TaskListRow[]> {
  let q = s.db
    .selectFrom('task_state as t')
    .select(['t.task_id', 't.tenant_id', 't.version', 't.status', 't.updated_at'])
    .select([activeQuarantine.as('quarantined'), activeHold.as('held')])
    .orderBy('t.updated_at', 'desc')
    .limit(limit);
  if (f.status && (STATUSES as readonly string[]).includes(f.status)) q = q.where('t.status', '=', f.status);
  if (f.tenant) q = q.where('t.tenant_id', '=', f.tenant);
  if (f.quarantined) q = q.where(activeQuarantine);
  if (f.held) q = q.where(activeHold);
  return q.execute();
}

/** A checkpoint with what verifying it concluded. */
export interface CheckedCheckpoint {
  seq: number;
  checkpoint_id: string;
  state_version: number;
  created_at: string;
  reason: string;
  verdict: 'ok' | 'digests match, signature not checked' | 'unavailable' | 'corrupt';
  problem?: string;
}

/** Everything the task page shows; undefined when the task is not visible to this scope. */
export async function taskPage(s: Scope, taskId: string, checkpointer: Checkpointer) {
  const store = createTaskStore({ db: s.db });
  const state = await store.get(taskId);
  if (!state) return undefined;
  const [history, stored, outbox, leases, receipts, quarantines, holds, annotations] = await Promise.all([
    store.history(taskId),
    checkpointer.list(taskId),
    s.db
      .selectFrom('outbox')
      .select(['message_id', 'topic', 'key', 'task_version', 'created_at', 'attempts', 'last_error'])
      .where('task_id', '=', taskId)
      .orderBy('id')
      .execute(),
    s.db.selectFrom('task_lease').selectAll().where('task_id', '=', taskId).execute(),
    receiptRows(s.db).where('task_id', '=', taskId).orderBy('started_at').execute(),
    s.db
      .selectFrom('task_quarantine')
      .selectAll()
      .where('task_id', '=', taskId)
      .orderBy('placed_at')
      .execute(),
    listHolds(s.db, { tenantId: state.tenant_id }),
    s.db.selectFrom('task_annotation').selectAll().where('task_id', '=', taskId).orderBy('at').execute(),
  ]);
  const checkpoints: CheckedCheckpoint[] = [];
  for (let i = 0; i < stored.length; i++) {
    const c = stored[i]!;
    const v = await checkpointer.verify(c, stored[i + 1]);
    checkpoints.push({
      seq: c.seq,
      checkpoint_id: c.checkpoint.checkpoint_id,
      state_version: c.checkpoint.state_version,
      created_at: String(c.checkpoint.created_at),
      reason: c.checkpoint.reason,
      verdict: v.ok
        ? v.signatureChecked
          ? 'ok'
          : 'digests match, signature not checked'
        : v.reason === 'unavailable'
          ? 'unavailable'
          : 'corrupt',
      ...(v.ok ? {} : { problem: v.message }),
    });
  }
  return {
    state,
    history,
    checkpoints,
    outbox,
    leases,
    receipts,
    quarantines,
    holds: holds.filter((h) => h.taskId === null || h.taskId === taskId),
    annotations,
  };
}

/** Receipt columns an operator needs; never the result itself (it may be the tenant's data). */
function receiptRows(db: Db) {
  return db
    .selectFrom('tool_receipt')
    .select([
      'receipt_id',
      'task_id',
      'tenant_id',
      'step',
      'tool',
      'status',
      'attempt',
      'irreversible',
      'worker',
      'lease_id',
      'fencing_token',
      'error',
      'resolution',
      'started_at',
      'finished_at',
    ]);
}

/** Per lane: how many messages wait and since when. */
export interface LaneBacklog {
  lane: number;
  backlog: number;
  oldest_seconds: number;
}

export interface BusPage {
  lanes: LaneBacklog[];
  /** Lanes per live owner (owner null: lanes no relay holds now), with their fencing tokens. */
  owners: Array<{ owner: string | null; lanes: number[]; fencing_tokens: string; lease_until: Date | null }>;
  parked: ParkedKey[];
  deadLetters: DeadLetter[];
}

export async function busPage(s: Scope): Promise<BusPage> {
  const [lanes, owners, parked, deadLetters] = await Promise.all([
    sql<LaneBacklog>`SELECT lane, count(*)::int AS backlog,
        extract(epoch FROM now() - min(created_at))::float8 AS oldest_seconds
      FROM outbox GROUP BY lane ORDER BY lane`.execute(s.db),
    sql<
      BusPage['owners'][number]
    >`SELECT CASE WHEN owner IS NOT NULL AND expires_at > now() THEN owner END AS owner,
        array_agg(lane ORDER BY lane) AS lanes, min(fencing_token)::text || '..' || max(fencing_token)::text AS fencing_tokens,
        min(expires_at) FILTER (WHERE owner IS NOT NULL AND expires_at > now()) AS lease_until
      FROM relay_lane GROUP BY 1 ORDER BY 1 NULLS LAST`.execute(s.owner),
    listParked(s.owner),
    listDeadLetters(s.db),
  ]);
  return {
    lanes: lanes.rows,
    owners: owners.rows,
    parked: s.tenant === undefined ? parked : parked.filter((p) => p.tenant === s.tenant),
    deadLetters: deadLetters.filter((d) => d.replayed_at === null),
  };
}

/** How long a receipt stays uncertain before the humans' page shows it as waiting for a retry. */
export const RETRY_OVERDUE_MINUTES = 5;
/** Rows of each list on the humans' page, oldest first: a tenant's role can make receipts without end. */
export const HUMANS_LIST_LIMIT = 100;

/**
 * Each tenant's oldest first, then each one's second oldest...: the lists show 100 rows, and a
 * tenant's role can make receipts without end (review: 101 of one tenant's hid every other
 * tenant's gated receipts from the operators).
 */
const eachTenantInTurn = sql`row_number() OVER (PARTITION BY coalesce(tenant_id, '') ORDER BY started_at, receipt_id)`;

/**
 * The humans-in-the-loop page: gated receipts, receipts left uncertain for a retry that has not
 * come (a resume declared their tool idempotent and no worker ran them again), quarantined
 * tasks, legal holds.
 */
export async function gatesPage(s: Scope) {
  const [gated, waiting, quarantined, holds] = await Promise.all([
    receiptRows(s.db)
      .where('status', '=', 'gated')
      .orderBy(eachTenantInTurn)
      .orderBy('started_at')
      .limit(HUMANS_LIST_LIMIT + 1)
      .execute(),
    receiptRows(s.db)
      .where('status', '=', 'uncertain')
      // Since its attempt was left (finished_at, set when it became uncertain), not since it started.
      .where(
        sql<Date>`coalesce(finished_at, started_at)`,
        '<',
        sql<Date>`now() - make_interval(mins => ${RETRY_OVERDUE_MINUTES})`,
      )
      .orderBy(eachTenantInTurn)
      .orderBy('started_at')
      .limit(HUMANS_LIST_LIMIT + 1)
      .execute(),
    s.db
      .selectFrom('task_quarantine')
      .selectAll()
      .where('released_at', 'is', null)
      .orderBy('placed_at')
      .execute(),
    listHolds(s.db, s.tenant ? { tenantId: s.tenant } : {}),
  ]);
  const leases = gated.length
    ? await s.db
        .selectFrom('task_lease')
        .selectAll()
        .where(
          'task_id',
          'in',
          gated.map((g) => g.task_id),
        )
        .execute()
    : [];
  return { gated, waiting, quarantined, holds, leases };
}

/** A gated receipt visible to this scope, or undefined. */
export function visibleReceipt(s: Scope, receiptId: string) {
  return receiptRows(s.db).where('receipt_id', '=', receiptId).executeTakeFirst();
}

/** The live numbers: what waits, and how fast messages leave the outbox and are applied. */
export interface LiveNumbers {
  at: string;
  backlog: number;
  oldest_seconds: number | null;
  /** Rows deleted from the outbox per second since the last sample (published or skipped). */
  published_per_s: number | null;
  applied_per_s: number;
}

/**
 * Samples the numbers, at most once a second per scope however many pages stream them;
 * `published_per_s` comes from the owner's table statistics, over the time between two
 * samples, and is only shown to a user bound to no tenant.
 */
export function liveSampler(everyMs = 1000) {
  let last: { at: number; deleted: number; rate: number | null } | undefined;
  const recent = new Map<string, { at: number; numbers: Promise<LiveNumbers> }>();
  async function published(owner: Db): Promise<number | null> {
    const { rows } = await sql<{ deleted: string }>`SELECT n_tup_del::text AS deleted FROM pg_stat_user_tables
        WHERE relid = 'outbox'::regclass`.execute(owner);
    const now = Date.now();
    const deleted = Number(rows[0]?.deleted ?? 0);
    if (last && now - last.at < everyMs) return last.rate;
    const rate = last ? Math.max(0, Math.round(((deleted - last.deleted) * 1000) / (now - last.at))) : null;
    last = { at: now, deleted, rate };
    return rate;
  }
  async function sample(s: Scope): Promise<LiveNumbers> {
    const [backlog, applied, rate] = await Promise.all([
      sql<{ n: number; oldest: number | null }>`SELECT count(*)::int AS n,
          extract(epoch FROM now() - min(created_at))::float8 AS oldest FROM outbox`.execute(s.db),
      sql<{ n: number }>`SELECT count(*)::int AS n FROM inbox
          WHERE outcome = 'applied' AND applied_at > now() - interval '10 seconds'`.execute(s.db),
      s.tenant === undefined ? published(s.owner) : Promise.resolve(null),
    ]);
    const b = backlog.rows[0]!;
    return {
      at: new Date().toISOString(),
      backlog: b.n,
      oldest_seconds: b.oldest === null ? null : Number(b.oldest.toFixed(1)),
      published_per_s: rate,
      applied_per_s: Math.round(applied.rows[0]!.n / 10),
    };
  }
  return (s: Scope): Promise<LiveNumbers> => {
    const key = s.tenant ?? '';
    const hit = recent.get(key);
    if (hit && Date.now() - hit.at < everyMs) return hit.numbers;
    const numbers = sample(s);
    recent.set(key, { at: Date.now(), numbers });
    numbers.catch(() => recent.delete(key));
    return numbers;
  };
}
