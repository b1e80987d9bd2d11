import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { ValidationError } from '../src/errors.js';
import { createLeaseManager } from '../src/leases/leases.js';
import { createReceiptStore } from '../src/receipts/receipts.js';
import { parsePolicy, resume } from '../src/recovery/resume.js';
import { createTaskStore } from '../src/state/taskStore.js';
import { checkpointerFromEnv } from './checkpointKeys.js';
import { line, UsageError } from './output.js';
import { withDb } from './withDb.js';

function readJson(flag: string, path: string | undefined): unknown {
  if (!path)
    throw new ValidationError('cairn resume', [{ path: `--${flag}`, message: 'is required (a JSON file)' }]);
  try {
    return JSON.parse(readFileSync(path, 'utf8'));
  } catch (err) {
    throw new ValidationError('cairn resume', [
      { path: `--${flag}`, message: `cannot read ${path}: ${(err as Error).message}` },
    ]);
  }
}

/**
 * `cairn resume <task> --workflow wf.json --policy policy.json --agent ID`: runs the resume
 * procedure from an operator's shell. Uncertain receipts are gated (a human decides): the
 * CLI has no compensation functions to run. `--idempotent-tools a,b` names tools whose API
 * applies an idempotency key once: their uncertain receipts are left for the worker's retry.
 */

export async function resumeCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      workflow: { type: 'string' },
      policy: { type: 'string' },
      agent: { type: 'string' },
      keyring: { type: 'string' },
      'idempotent-tools': { type: 'string' },
      actor: { type: 'string', default: `spiffe://cairn.local/operator/${process.env.USER ?? 'unknown'}` },
      json: { type: 'boolean' },
    },
  });
  const taskId = positionals[0];
  if (!taskId || !values.agent) {
    throw new UsageError(
      'usage: cairn resume <task> --workflow wf.json --policy policy.json --agent ID [--keyring F] [--idempotent-tools a,b] [--json]\n' +
        '  (CAIRN_KEYRING: the KEK file for encrypted checkpoints; CAIRN_CHECKPOINT_KEYS: the signing key ring)',
    );
  }
  const workflowDefinition = readJson('workflow', values.workflow);
  // Validated before anything is opened: a policy that says "allowed": "false" is refused.
  const policy = parsePolicy(readJson('policy', values.policy), `policy file ${values.policy}`);
  const idempotentTools = values['idempotent-tools']?.split(',').map((t) => t.trim());
  if (idempotentTools?.some((t) => t === ''))
    throw new ValidationError('cairn resume', [
      {
        path: '--idempotent-tools',
        message: `${JSON.stringify(values['idempotent-tools'])} has an empty tool name`,
      },
    ]);
  return withDb(async (db) => {
    // The same keys the agents use: without them an encrypted checkpoint cannot be read, and
    // resume would stop (an outage) rather than resume.
    const { checkpointer: checkpoints, keys } = checkpointerFromEnv(db, values.keyring);
    const plan = await resume(taskId, {
      db,
      store: createTaskStore({ db, checkpointer: checkpoints }),
      checkpoints,
      receipts: createReceiptStore({ db, ...(keys ? { keys } : {}) }),
      leases: createLeaseManager({ db }),
      workflowDefinition,
      policy: async () => policy,
      actor: values.actor!,
      agentId: values.agent!,
      ...(idempotentTools ? { idempotentTools } : {}),
    });
    if (values.json) console.log(JSON.stringify(plan, null, 2));
    else {
      console.log(
        line`${plan.taskId}: ${plan.outcome} from checkpoint ${plan.checkpointId ?? '(none)'} at v${plan.state.version} ${plan.state.status}`,
      );
      for (const s of plan.skipped)
        console.log(line`  skipped corrupt checkpoint ${s.checkpointId}: ${s.reason}`);
      if (plan.budget)
        console.log(
          line`  budget committed ${plan.budget.committedBefore} -> ${plan.budget.committedAfter} USD (limit ${plan.budget.limit}, ${plan.policyVersion})`,
        );
      for (const r of plan.receipts)
        console.log(line`  receipt ${r.receiptId} ${r.tool} at ${r.step}: ${r.action}`);
      for (const m of plan.pendingMessages) console.log(line`  message ${m.messageId}: ${m.state}`);
      if (plan.lease)
        console.log(line`  lease held by ${plan.lease.agentId}, fencing token ${plan.lease.fencingToken}`);
    }
    return plan.outcome === 'failed' ? 1 : 0;
  }, 4);
}
