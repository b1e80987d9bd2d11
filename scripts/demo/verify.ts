import { isDeepStrictEqual } from 'node:util';
import { sql } from 'kysely';
import { checkpointKeysFromEnv } from '../../cli/checkpointKeys.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import type { Db } from '../../src/db/database.js';
import { replayAudit } from '../../src/state/replay.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { DEFAULT_REQUIRED_GATES } from '../../src/state/transitions.js';
import type { Sink } from '../lib/effectSink.js';

export interface Check {
  name: string;
  expected: string;
  actual: string;
  violations: number;
  /** Why the check could not run (a dependency did not answer): neither a violation nor a pass. */
  notChecked?: string;
}

/** How a check reads in a report: ok, VIOLATION xN, or NOT CHECKED. */
export const verdict = (c: Check): string =>
  c.violations > 0 ? `VIOLATION x${c.violations}` : c.notChecked ? 'NOT CHECKED' : 'ok';

/**
 * Checks the outcome from the database and the sink only, never from counters the demo kept:
 * `tasks` tasks complete, and every check of `verifyTasks`.
 */
export async function verifyDemo(
  db: Db,
  sink: Sink,
  tasks: number,
  o: { only?: (taskId: string) => boolean } = {},
): Promise<Check[]> {
  const only = o.only ?? (() => true);
  const complete = (
    await db.selectFrom('task_state').select('task_id').where('status', '=', 'complete').execute()
  ).filter((r) => only(r.task_id)).length;
  return [
    {
      name: 'tasks complete',
      expected: String(tasks),
      actual: String(complete),
      violations: tasks - complete,
    },
    ...(await verifyTasks(db, sink, o)),
  ];
}

/**
 * Per task: audit replay equals state, versions contiguous, gates consistent, checkpoints
 * verify, the deploy ran exactly once if complete (at most once otherwise); no outbox row
 * left; receipts settled.
 */
export async function verifyTasks(
  db: Db,
  sink: Sink,
  o: { only?: (taskId: string) => boolean } = {},
): Promise<Check[]> {
  const store = createTaskStore({ db, cacheSize: 0 });
  const keys = checkpointKeysFromEnv(db);
  const checkpoints = createCheckpointer({ db, ...keys });
  const ids = (await db.selectFrom('task_state').select('task_id').orderBy('task_id').execute())
    .map((r) => r.task_id)
    .filter(o.only ?? (() => true));
  const checks: Check[] = [];
  const add = (name: string, expected: string, actual: string, violations: number) =>
    checks.push({ name, expected, actual, violations });

  const complete = new Set<string>();
  let replayBad = 0;
  let gapBad = 0;
  let gateBad = 0;
  let checkpointBad = 0;
  for (const id of ids) {
    const state = (await store.get(id))!;
    if (state.status === 'complete') complete.add(id);
    const history = await store.history(id);
    if (history.length !== state.version || history.some((h, i) => h.version !== i + 1)) gapBad++;
    try {
      if (!isDeepStrictEqual(replayAudit(history), state)) replayBad++;
    } catch {
      replayBad++;
    }
    const gatesNeeded = state.status === 'complete' ? DEFAULT_REQUIRED_GATES : [];
    if (gatesNeeded.some((g) => !state.gates[g])) gateBad++;
    const list = await checkpoints.list(id);
    for (let i = 0; i < list.length; i++)
      if (!(await checkpoints.verify(list[i]!, list[i + 1])).ok) checkpointBad++;
  }
  add('audit replay equals state', `${ids.length} tasks`, `${ids.length - replayBad} tasks`, replayBad);
  add(
    'versions contiguous, one audit row each',
    `${ids.length} tasks`,
    `${ids.length - gapBad} tasks`,
    gapBad,
  );
  add('gates consistent with status', '0 inconsistent', `${gateBad} inconsistent`, gateBad);
  add(
    `checkpoints verify (digest, chain${keys.keyRing ? ', signature' : ''})`,
    '0 corrupt',
    `${checkpointBad} corrupt`,
    checkpointBad,
  );

  // Deploys: the sink saw exactly one idempotency key per task, and applied it once.
  let deployBad = 0;
  let deploys = 0;
  for (const id of ids) {
    const keys = sink.keysByOperation.get(id);
    const applied = keys ? [...keys].reduce((n, k) => n + (sink.applied.get(k) ?? 0), 0) : 0;
    deploys += applied;
    const expected = complete.has(id) ? 1 : applied === 0 ? 0 : 1; // not complete: at most once
    if ((keys?.size ?? 0) !== expected || applied !== expected) deployBad++;
  }
  add(
    'deploys executed exactly once (sink)',
    ids.length > complete.size ? `${complete.size} (+<=1 each open)` : `${complete.size}`,
    `${deploys} (${deployBad} tasks wrong)`,
    deployBad,
  );

  const outbox = await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox`.execute(db);
  add('no outbox row left', '0', String(outbox.rows[0]!.n), outbox.rows[0]!.n);
  // Every open receipt but those of tasks left out (`only`): a task held after a failover keeps
  // the receipt it had at the promotion (a deploy region A was running when it died stays
  // started, held). A receipt whose task row is gone is counted.
  const open = await sql<{ task_id: string }>`
    SELECT task_id FROM tool_receipt WHERE status NOT IN ('succeeded', 'compensated')`.execute(db);
  const unsettled = open.rows.filter((r) => o.only?.(r.task_id) ?? true).length;
  add('receipts settled', '0 open', `${unsettled} open`, unsettled);
  return checks;
}
