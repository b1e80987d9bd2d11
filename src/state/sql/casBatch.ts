import { CompiledQuery } from 'kysely';
import type { Executor } from '../../db/executor.js';
import { PREPARED } from '../../db/pool.js';
import { SqlState, sqlState } from '../../db/sqlstate.js';
import type { CasRow } from './casUpdate.js';

/**
 * Coalesces the compare-and-swaps that one Db receives at the same time, outside any
 * transaction, into one statement: while {@link MAX_IN_FLIGHT} statements are running, new
 * CAS requests wait, and the next statement carries waiting ones of one tenant (up to
 * {@link MAX_BATCH}, one per task; tenants take turns). A CAS that finds the Db idle goes
 * after the current turn of the event loop, in a statement of its own.
 *
 * Each request keeps the outcome it would have had alone:
 * - The statement (`cairn_cas_batch`, migration 0014) first locks the rows it can (`FOR UPDATE
 *   SKIP LOCKED`): a row another transaction holds is not waited for inside the batch but run
 *   alone afterwards, outside the batch's slot, where it waits as before.
 * - Only locked rows are updated, each with its own `version` and `updated_at` check,
 *   re-evaluated against the newest committed row (READ COMMITTED), as alone.
 * - Whatever else the statement would wait for (an uncommitted audit row of the same version
 *   that a tenant's own transaction holds, say) it waits for at most 100 ms (its lock_timeout):
 *   then Postgres refuses it, and the requests run alone.
 * - When Postgres refuses the statement (a trigger's check, a constraint, a timeout) nothing of
 *   it was written: each request is then run alone, so only the one Postgres refuses gets the
 *   error, with its own message.
 * - When the session ends instead (a lost connection, a FATAL or PANIC, which can come after
 *   the commit), the outcome is unknown: every request of it gets that error, never a "stale"
 *   answer it might not deserve.
 * A batch holds one tenant's tasks only and gives up its slot after {@link SLOT_HOLD_MS}
 * even if its statement still runs, so no batch holds up another tenant's. Atomicity is per
 * request as before; a batch adds none between requests and takes none away.
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
  return c.noBatches ? alone(db, row) : c.submit(row);
}

class Coalescer {
  /**
   * Waiting requests by tenant, then by task, in the order they came: tenants take turns
   * (the one served last goes to the back), a task's requests wait behind its first. Each
   * step touches what it takes, never the whole queue.
   */
  private readonly waiting = new Map<string, Map<string, Waiting[]>>();
  /** Task ids in a statement now (for up to SLOT_HOLD_MS): a second CAS of one waits for the first's outcome. */
  private readonly busy = new Set<string>();
  private inFlight = 0;
  private scheduled = false;
  /** Set when the database has no cairn_cas_batch (not migrated to 0014): every request goes alone. */
  noBatches = false;

  constructor(
    private readonly db: Executor,
    private readonly alone: RunAlone,
  ) {}

  submit(row: CasRow): Promise<boolean> {
    return new Promise((resolve, reject) => {
      let tasks = this.waiting.get(row.tenantId);
      if (!tasks) {
        tasks = new Map();
        this.waiting.set(row.tenantId, tasks);
      }
      const queue = tasks.get(row.taskId);
      if (queue) queue.push({ row, resolve, reject });
      else tasks.set(row.taskId, [{ row, resolve, reject }]);
      this.schedule();
    });
  }

  /** After the current turn of the event loop, so the requests made in it go together. */
  private schedule(): void {
    if (this.scheduled || this.inFlight >= MAX_IN_FLIGHT || this.waiting.size === 0) return;
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
      // Past the slot's time its tasks are no longer kept out of other statements either: a
      // statement whose answer never comes (a socket frozen by a partition) must not hold up
      // the next update of up to 64 tasks. Postgres still decides: a row the first statement
      // holds is skipped by the next batch and waited for alone, as without coalescing.
      const timer = setTimeout(() => {
        for (const w of batch) this.busy.delete(w.row.taskId);
        release();
      }, SLOT_HOLD_MS);
      timer.unref();
      void this.send(batch).finally(() => {
        clearTimeout(timer);
        release();
      });
    }
  }

  /** The first waiting request of up to MAX_BATCH tasks not in a statement now, of the first tenant that has one. */
  private take(): Waiting[] {
    for (const [tenant, tasks] of this.waiting) {
      const batch: Waiting[] = [];
      const served: string[] = [];
      for (const [taskId, queue] of tasks) {
        if (batch.length === MAX_BATCH) break;
        if (this.busy.has(taskId)) continue;
        this.busy.add(taskId);
        batch.push(queue.shift()!);
        served.push(taskId);
      }
      // A served task with more waiting goes to the back of its tenant's line: tasks with
      // steady traffic would otherwise fill every batch ahead of one that asked later.
      for (const taskId of served) {
        const queue = tasks.get(taskId)!;
        tasks.delete(taskId);
        if (queue.length > 0) tasks.set(taskId, queue);
      }
      if (batch.length === 0) continue;
      // Its turn is over: to the back of the line, or out of it.
      this.waiting.delete(tenant);
      if (tasks.size > 0) this.waiting.set(tenant, tasks);
      return batch;
    }
    return [];
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
   * `won` swapped its task from the document it expected (version and updated_at): requests
   * waiting that expect that same document would find a newer one, so they are answered
   * without a statement, as a CAS that had waited for the row's lock would have been.
   */
  private outrun(won: CasRow): void {
    const tasks = this.waiting.get(won.tenantId);
    const queue = tasks?.get(won.taskId);
    if (!tasks || !queue) return;
    const lost = (w: Waiting) =>
      w.row.expectedVersion === won.expectedVersion && w.row.expectedUpdatedAt === won.expectedUpdatedAt;
    for (const w of queue.filter(lost)) w.resolve(false);
    const rest = queue.filter((w) => !lost(w));
    if (rest.length > 0) tasks.set(won.taskId, rest);
    else tasks.delete(won.taskId);
    if (tasks.size === 0) this.waiting.delete(won.tenantId);
  }

  /** Resolves once the batch's statement is done; requests run alone after it settle later. */
  private async send(batch: Waiting[]): Promise<void> {
    let outcome: { locked: string[]; swapped: string[] };
    let input: string;
    try {
      input = batchInput(batch);
    } catch {
      // Nothing was sent: a document JSON cannot write, or a batch of large ones past V8's
      // longest string (RangeError). Each alone, so only a request that cannot go gets an error.
      for (const w of batch) void this.settle(w, this.alone(this.db, w.row));
      return;
    }
    try {
      outcome = await runBatch(this.db, input);
    } catch (error) {
      // A database not migrated to 0014 yet has no batch function: send each alone from now on.
      if (sqlState(error) === SqlState.undefinedFunction) this.noBatches = true;
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
 * Postgres refused the statement and its session goes on: it was rolled back, nothing of it
 * is written. Anything else leaves the outcome unknown: an error that is not the server's (no
 * severity: a socket's EPIPE has a five-letter code too), a FATAL or PANIC (the session ended,
 * perhaps after the commit), or a code that ends the session or comes from the server's own
 * failure (08 connection, 57P0x shutdown and termination, 58 system error, XX internal)
 * whatever the language of its severity. A statement timeout or cancel (57014) is a refusal.
 */
function refusedByServer(error: unknown): boolean {
  const state = sqlState(error);
  const severity = (error as { severity?: unknown }).severity;
  return (
    state !== undefined &&
    typeof severity === 'string' &&
    severity !== 'FATAL' &&
    severity !== 'PANIC' &&
    !/^(08|57P|58|XX)/.test(state)
  );
}

/** The batch function's one parameter: the requests as a JSON array. */
function batchInput(batch: Waiting[]): string {
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
  return JSON.stringify(input);
}

async function runBatch(db: Executor, input: string): Promise<{ locked: string[]; swapped: string[] }> {
  const result = await db.executeQuery<{ locked: string[]; swapped: string[] }>(
    CompiledQuery.raw(BATCH_SQL, [input]),
  );
  return result.rows[0]!;
}

/** casUpdate's statement for many rows, as one JSON array parameter (migration 0014). */
const BATCH_SQL = `${PREPARED}
    SELECT locked_ids AS locked, swapped_ids AS swapped FROM cairn_cas_batch($1::jsonb)`;
