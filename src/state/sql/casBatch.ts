import { CompiledQuery } from 'kysely';
import type { Executor } from '../../db/executor.js';
import { PREPARED } from '../../db/pool.js';
import { SqlState, sqlState } from '../../db/sqlstate.js';
import type { CasRow } from './casUpdate.js';

/**
 * Coalesces the compare-and-swaps that one Db receives at the same time, outside any
 * transaction, into one statement: while {@link MAX_IN_FLIGHT} statements are running, new
 * CAS requests wait, and the next statement carries every one of them of the same tenant (up
 * to {@link MAX_BATCH}, one per task). A CAS that finds the Db idle goes after the current
 * turn of the event loop, in a statement of its own.
 *
 * Each request keeps the outcome it would have had alone:
 * - The statement first locks the rows it can (`FOR UPDATE SKIP LOCKED`): a row another
 *   transaction holds is not waited for inside the batch (it would stall every other task
 *   in it) but run alone afterwards, outside the batch's slot, where it waits as before.
 * - A batch holds one tenant's tasks only, and gives up its slot after
 *   {@link SLOT_HOLD_MS} even if its statement still runs: what a tenant's own SQL makes the
 *   statement wait for (an uncommitted audit row of the same version, say) stalls that
 *   tenant's tasks in it, never another tenant's, nor the batches after it.
 * - Only locked rows are updated, each with its own `version` and `updated_at` check,
 *   re-evaluated against the newest committed row (READ COMMITTED), as alone.
 * - When Postgres refuses the statement (a trigger's check, a constraint, a statement
 *   timeout) nothing of it was written: each request is then run alone, so only the one
 *   Postgres refuses gets the error, with its own message.
 * - When the connection fails instead, the outcome is unknown (the statement may have
 *   committed): every request of it gets that error, never a "stale" answer it might not deserve.
 * Atomicity is per request as before; a batch adds none between requests and takes none away.
 */
export const MAX_BATCH = 64;
export const MAX_IN_FLIGHT = 2;
export const SLOT_HOLD_MS = 100;

interface Waiting {
  row: CasRow;
  resolve: (swapped: boolean) => void;
  reject: (error: unknown) => void;
}

type RunAlone = (db: Executor, row: CasRow) => Promise<boolean>;

const coalescers = new WeakMap<Executor, Coalescer>();

/** The CAS of `row` on `db` (not a transaction), sent with whatever else `db` is asked at the same time. */
export function coalescedCas(db: Executor, row: CasRow, alone: RunAlone): Promise<boolean> {
  let c = coalescers.get(db);
  if (!c) {
    c = new Coalescer(db, alone);
    coalescers.set(db, c);
  }
  return c.submit(row);
}

class Coalescer {
  private waiting: Waiting[] = [];
  /** Task ids in a statement now: a second CAS of one waits for the first's outcome. */
  private readonly busy = new Set<string>();
  private inFlight = 0;
  private scheduled = false;

  constructor(
    private readonly db: Executor,
    private readonly alone: RunAlone,
  ) {}

  submit(row: CasRow): Promise<boolean> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ row, resolve, reject });
      this.schedule();
    });
  }

  /** After the current turn of the event loop, so the requests made in it go together. */
  private schedule(): void {
    if (this.scheduled || this.inFlight >= MAX_IN_FLIGHT || this.waiting.length === 0) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      this.flush();
    });
  }

  private flush(): void {
    while (this.inFlight < MAX_IN_FLIGHT) {
      const batch = this.take();
      if (batch.length === 0) return;
      this.inFlight++;
      let held = true;
      const release = () => {
        if (!held) return;
        held = false;
        this.inFlight--;
        this.schedule();
      };
      const timer = setTimeout(release, SLOT_HOLD_MS);
      timer.unref();
      void this.send(batch).finally(() => {
        clearTimeout(timer);
        release();
      });
    }
  }

  /** The waiting requests of the oldest one's tenant, of distinct tasks not in a statement now, oldest first. */
  private take(): Waiting[] {
    const batch: Waiting[] = [];
    const rest: Waiting[] = [];
    let tenant: string | undefined;
    for (const w of this.waiting) {
      const free = !this.busy.has(w.row.taskId);
      if (free && tenant === undefined) tenant = w.row.tenantId;
      if (free && batch.length < MAX_BATCH && w.row.tenantId === tenant) {
        this.busy.add(w.row.taskId);
        batch.push(w);
      } else rest.push(w);
    }
    this.waiting = rest;
    return batch;
  }

  private settle(w: Waiting, outcome: Promise<boolean>): Promise<void> {
    return outcome
      .then((swapped) => {
        if (swapped) this.outrun(w.row);
        w.resolve(swapped);
      }, w.reject)
      .finally(() => {
        this.busy.delete(w.row.taskId);
        this.schedule();
      });
  }

  /**
   * `won` swapped its task from its expected version: the requests waiting with the same
   * expected version would find a newer one (versions only grow), so they are answered
   * without a statement, as a CAS that had waited for the row's lock would have been.
   */
  private outrun(won: CasRow): void {
    const lost = (w: Waiting) => w.row.taskId === won.taskId && w.row.expectedVersion === won.expectedVersion;
    if (!this.waiting.some(lost)) return;
    for (const w of this.waiting.filter(lost)) w.resolve(false);
    this.waiting = this.waiting.filter((w) => !lost(w));
  }

  /** Resolves once the batch's statement is done; requests run alone after it settle later. */
  private async send(batch: Waiting[]): Promise<void> {
    let outcome: { locked: string[]; swapped: string[] };
    try {
      outcome = await runBatch(this.db, batch);
    } catch (error) {
      if (!refusedByServer(error)) {
        for (const w of batch) void this.settle(w, Promise.reject(error));
        return;
      }
      for (const w of batch) void this.settle(w, this.alone(this.db, w.row));
      return;
    }
    const locked = new Set(outcome.locked);
    const swapped = new Set(outcome.swapped);
    for (const w of batch) {
      const id = w.row.taskId;
      void this.settle(w, locked.has(id) ? Promise.resolve(swapped.has(id)) : this.alone(this.db, w.row));
    }
  }
}

/**
 * Postgres answered the statement with an error: it was rolled back, nothing of it is
 * written. A connection that failed (no SQLSTATE, class 08, a server shutting down) leaves
 * the outcome unknown.
 */
function refusedByServer(error: unknown): boolean {
  const state = sqlState(error);
  return (
    state !== undefined &&
    !state.startsWith('08') &&
    state !== SqlState.adminShutdown &&
    state !== SqlState.crashShutdown &&
    state !== SqlState.cannotConnectNow
  );
}

async function runBatch(db: Executor, batch: Waiting[]): Promise<{ locked: string[]; swapped: string[] }> {
  const input = batch.map(({ row }) => ({
    task_id: row.taskId,
    status: row.status,
    schema_version: row.schemaVersion,
    doc: row.doc,
    expected_version: row.expectedVersion,
    expected_updated_at: row.expectedUpdatedAt,
    actor: row.audit.actor,
    reason: row.audit.reason,
    patch: row.audit.patch,
  }));
  const result = await db.executeQuery<{ locked: string[]; swapped: string[] }>(
    CompiledQuery.raw(BATCH_SQL, [JSON.stringify(input)]),
  );
  return result.rows[0]!;
}

/**
 * The batch: casUpdate's statement for many rows (one JSON array parameter), plus the lock
 * step that leaves rows held elsewhere to be run alone. Values are only parameters.
 */
const BATCH_SQL = `${PREPARED}
    WITH input AS (
      SELECT *
        FROM jsonb_to_recordset($1::jsonb) AS i(task_id text, status text, schema_version text, doc jsonb,
             expected_version bigint, expected_updated_at text, actor text, reason text, patch jsonb)
    ), locked AS (
      SELECT t.task_id
        FROM task_state t
       WHERE t.task_id IN (SELECT task_id FROM input)
       ORDER BY t.task_id
         FOR UPDATE OF t SKIP LOCKED
    ), swapped AS (
      UPDATE task_state t
         SET version = t.version + 1,
             status = i.status,
             schema_version = i.schema_version,
             doc = i.doc,
             updated_at = now()
        FROM input i
       WHERE t.task_id = i.task_id
         AND t.task_id IN (SELECT task_id FROM locked)
         AND t.version = i.expected_version
         AND t.doc->>'updated_at' = i.expected_updated_at
      RETURNING t.task_id, t.tenant_id, t.version, i.actor, i.reason, i.patch
    ), audited AS (
      INSERT INTO task_audit (task_id, version, prev_version, tenant_id, actor, reason, patch)
      SELECT task_id, version, version - 1, tenant_id, actor, reason, patch
        FROM swapped
      RETURNING task_id
    )
    SELECT ARRAY(SELECT task_id FROM locked) AS locked, ARRAY(SELECT task_id FROM audited) AS swapped`;
