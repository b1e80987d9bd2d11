import { parseArgs } from 'node:util';
import { createCheckpointer } from '../checkpoints/checkpoints.js';
import { createTaskStore } from '../state/taskStore.js';
import { withDb } from './withDb.js';

/** `cairn task show <id>` (state and a readable timeline) and `cairn task history <id>` (the audit rows). */
export async function taskCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: { json: { type: 'boolean' } },
  });
  const [sub, id] = positionals;
  if ((sub !== 'show' && sub !== 'history') || !id) {
    console.error('usage: cairn task show|history <task_id> [--json]');
    return 2;
  }
  return withDb(async (db) => {
    const store = createTaskStore({ db });
    const state = await store.get(id);
    if (!state) {
      console.error(`cairn task: task ${id} does not exist`);
      return 1;
    }
    const history = await store.history(id);
    if (values.json) {
      console.log(JSON.stringify(sub === 'show' ? { state, history } : history, null, 2));
      return 0;
    }
    if (sub === 'show') {
      const gates = Object.entries(state.gates).map(([g, v]) => `${v ? '+' : '-'}${g}`);
      console.log(`${state.task_id} (tenant ${state.tenant_id}) v${state.version} ${state.status}`);
      console.log(`gates: ${gates.join(' ')}`);
      console.log(
        `budget: ${state.budget.currency_spent_usd}/${state.budget.currency_committed_usd} USD, ${state.budget.tokens_spent} tokens, ${state.budget.hops_used} hops`,
      );
      console.log(
        `agents: active ${state.active_agents.join(', ') || '-'}; done ${state.completed_agents.join(', ') || '-'}`,
      );
    }
    for (const h of history) {
      const ops = (h.patch as Array<{ op: string; path: string }>)
        .filter((p) => !['/version', '/updated_at', '/updated_by'].includes(p.path))
        .map((p) => `${p.op} ${p.path}`);
      console.log(`v${h.version}  ${h.at.toISOString()}  ${h.actor}  ${h.reason ?? ''}  [${ops.join(', ')}]`);
    }
    return 0;
  });
}

/** `cairn checkpoint list <task>` and `cairn checkpoint verify <task>`: digest, signature and chain of each. */
export async function checkpointCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: { json: { type: 'boolean' } },
  });
  const [sub, taskId] = positionals;
  if ((sub !== 'list' && sub !== 'verify') || !taskId) {
    console.error('usage: cairn checkpoint list|verify <task_id> [--json]');
    return 2;
  }
  return withDb(async (db) => {
    // Verification needs the key ring that signed them: CAIRN_CHECKPOINT_KEYS=kid:secret,... (current first).
    const keys = (process.env.CAIRN_CHECKPOINT_KEYS ?? '').split(',').filter(Boolean);
    const ring = keys.length
      ? {
          current: keys[0]!.split(':')[0]!,
          keys: Object.fromEntries(
            keys.map((k) => [k.split(':')[0]!, Buffer.from(k.split(':').slice(1).join(':'))]),
          ),
        }
      : undefined;
    const checkpoints = createCheckpointer({ db, ...(ring ? { keyRing: ring } : {}) });
    const list = await checkpoints.list(taskId);
    const rows = [];
    let bad = 0;
    for (let i = 0; i < list.length; i++) {
      const c = list[i]!;
      const v = sub === 'verify' ? await checkpoints.verify(c, list[i + 1]) : undefined;
      if (v && !v.ok) bad++;
      rows.push({
        seq: c.seq,
        checkpoint_id: c.checkpoint.checkpoint_id,
        state_version: c.checkpoint.state_version,
        created_at: c.checkpoint.created_at,
        reason: c.checkpoint.reason,
        ...(v ? { valid: v.ok, problem: v.ok ? undefined : v.reason } : {}),
      });
    }
    if (values.json) console.log(JSON.stringify(rows, null, 2));
    else {
      if (rows.length === 0) console.log(`no checkpoints for task ${taskId}`);
      for (const r of rows) {
        const status = r.valid === undefined ? '' : r.valid ? 'ok       ' : `CORRUPT (${r.problem}) `;
        console.log(
          `#${r.seq}  ${status}${r.checkpoint_id}  v${r.state_version}  ${r.created_at}  ${r.reason}`,
        );
      }
    }
    return bad > 0 ? 1 : 0;
  });
}
