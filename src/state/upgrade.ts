import type { Db } from '../db/database.js';
import { TASK_STATE_V2 } from '../schemas/taskState.js';
import { parseStoredTaskState } from './parseStored.js';
import type { TaskStore } from './taskStore.js';
import { isTerminal } from './transitions.js';

export interface UpgradeReport {
  upgraded: number;
  /** Terminal tasks never change; they stay stored as v1 and are upcast whenever read. */
  terminalLeftAsIs: number;
  /** Lost a CAS race with a live writer; the next run picks them up (or the writer already upgraded them). */
  raced: number;
}

/**
 * Rewrites every task stored under an older schema_version as v2, one CAS update per task
 * (so a live writer is never overwritten, and each rewrite gets its audit row).
 */
export async function upgradeStoredTasks(opts: {
  db: Db;
  store: TaskStore;
  actor: string;
  batchSize?: number;
}): Promise<UpgradeReport> {
  const report: UpgradeReport = { upgraded: 0, terminalLeftAsIs: 0, raced: 0 };
  let after = '';
  for (;;) {
    const rows = await opts.db
      .selectFrom('task_state')
      .select(['task_id', 'tenant_id', 'version', 'doc'])
      .where('schema_version', '<>', TASK_STATE_V2)
      .where('task_id', '>', after)
      .orderBy('task_id')
      .limit(opts.batchSize ?? 500)
      .execute();
    if (rows.length === 0) return report;
    for (const row of rows) {
      after = row.task_id;
      const state = parseStoredTaskState(row);
      if (isTerminal(state.status)) {
        report.terminalLeftAsIs++;
        continue;
      }
      const r = await opts.store.update({
        taskId: row.task_id,
        expectedVersion: row.version,
        patch: {},
        actor: opts.actor,
        reason: 'schema upgrade to oaies.task-state.v2',
      });
      if (r.ok) report.upgraded++;
      else report.raced++;
    }
  }
}
