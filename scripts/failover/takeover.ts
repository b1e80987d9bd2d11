import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import type { KeyRing } from '../../src/checkpoints/signing.js';
import type { Db } from '../../src/db/database.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import type { FailoverReport } from '../../src/recovery/failover.js';
import type { ReplayReport } from '../../src/recovery/replayChangelog.js';
import { resume } from '../../src/recovery/resume.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { isTerminal } from '../../src/state/transitions.js';
import type { Check } from '../demo/verify.js';
import { WORKFLOW_DEFINITION } from '../demo/workflow.js';
import type { Sink } from '../lib/effectSink.js';
import { rebuiltTasksDone } from './changelogReplay.js';
import { heldTasksTouched } from './evidence.js';

/**
 * Region B takes over (scenario.ts): every task neither finished nor held is resumed from its
 * checkpoint. Returns how many were.
 */
export async function resumeOpenTasks(dbB: Db, ring: KeyRing, held: ReadonlySet<string>): Promise<number> {
  const checkpointsB = createCheckpointer({ db: dbB, keyRing: ring });
  const storeB = createTaskStore({ db: dbB, checkpointer: checkpointsB });
  const leasesB = createLeaseManager({ db: dbB });
  const receiptsB = createReceiptStore({ db: dbB, checkpointer: checkpointsB, worker: 'failover-resumer' });
  let resumed = 0;
  for (const t of await dbB.selectFrom('task_state').select(['task_id', 'status']).execute()) {
    if (isTerminal(t.status as never) || held.has(t.task_id)) continue;
    const plan = await resume(t.task_id, {
      db: dbB,
      store: storeB,
      checkpoints: checkpointsB,
      receipts: receiptsB,
      leases: leasesB,
      workflowDefinition: WORKFLOW_DEFINITION,
      policy: async () => ({ version: 'failover', allowed: true, budgetLimitUsd: 5 }),
      actor: 'spiffe://demo.cairn.local/failover/resumer',
      agentId: 'failover-resumer',
      leaseTtlMs: 5000,
      // A tester frozen by the async cut (or killed) inside its deploy left the receipt
      // started; gated, the task would wait for a human. The deploy API applies a key once,
      // as the tester's own runOnce declares: it runs it again with the same key.
      idempotentTools: ['deployer'],
    });
    if (plan.lease) await leasesB.release(plan.lease);
    if (plan.outcome === 'resumed') resumed++;
  }
  return resumed;
}

/**
 * What the effect sink and region B say after the takeover: no effect twice, held tasks
 * untouched, rebuilt tasks done, and with synchronous replication (`rpoZero`) nothing the world
 * saw lost.
 */
export async function effectChecks(
  dbB: Db,
  sink: Sink,
  o: {
    held: ReadonlySet<string>;
    rebuilt: ReplayReport['rebuilt'];
    rpoZero: { report: FailoverReport; witnessLost: number } | undefined;
  },
): Promise<Check[]> {
  const checks: Check[] = [];
  let doubled = 0;
  for (const keys of sink.keysByOperation.values()) {
    if (keys.size > 1 || [...keys].some((k) => (sink.applied.get(k) ?? 0) > 1)) doubled++;
  }
  checks.push({
    name: 'no effect twice, held tasks included (sink)',
    expected: '0',
    actual: String(doubled),
    violations: doubled,
  });
  // Held tasks stay exactly as they were held: no transition, no new effect in region B.
  const touched = await heldTasksTouched(dbB, [...o.held]);
  checks.push({
    name: 'held tasks untouched in region B',
    expected: `${o.held.size} untouched`,
    actual: `${touched.length} changed`,
    violations: touched.length,
  });
  checks.push(await rebuiltTasksDone(dbB, sink, o.rebuilt));
  if (o.rpoZero) {
    const { report, witnessLost } = o.rpoZero;
    const lost =
      report.lostTransitions.length + report.lostConsumptions.length + report.missingReceipts.length;
    checks.push({
      name: 'RPO 0: acknowledged witness writes lost',
      expected: '0',
      actual: String(witnessLost),
      violations: witnessLost,
    });
    checks.push({
      name: 'RPO 0: transitions the world saw, lost',
      expected: '0',
      actual: String(lost),
      violations: lost,
    });
  }
  return checks;
}
