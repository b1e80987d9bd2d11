import { parseArgs } from 'node:util';
import { NotFoundError } from '../src/errors.js';
import { ExitCode } from '../src/exitCodes.js';
import { createTaskStore } from '../src/state/taskStore.js';
import { checkpointerFromEnv } from './checkpointKeys.js';
import { line, UsageError } from './output.js';
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
    throw new UsageError('usage: cairn task show|history <task_id> [--json]');
  }
  return withDb(async (db) => {
    const store = createTaskStore({ db });
    const state = await store.get(id);
    if (!state) throw new NotFoundError('task', id);
    const history = await store.history(id);
    if (values.json) {
      console.log(JSON.stringify(sub === 'show' ? { state, history } : history, null, 2));
      return 0;
    }
    if (sub === 'show') {
      const gates = Object.entries(state.gates).map(([g, v]) => `${v ? '+' : '-'}${g}`);
      console.log(line`${state.task_id} (tenant ${state.tenant_id}) v${state.version} ${state.status}`);
      console.log(line`gates: ${gates.join(' ')}`);
      console.log(
        line`budget: ${state.budget.currency_spent_usd}/${state.budget.currency_committed_usd} USD, ${state.budget.tokens_spent} tokens, ${state.budget.hops_used} hops`,
      );
      console.log(
        line`agents: active ${state.active_agents.join(', ') || '-'}; done ${state.completed_agents.join(', ') || '-'}`,
      );
    }
    for (const h of history) {
      const ops = (h.patch as Array<{ op: string; path: string }>)
        .filter((p) => !['/version', '/updated_at', '/updated_by'].includes(p.path))
        .map((p) => `${p.op} ${p.path}`);
      console.log(
        line`v${h.version}  ${h.at.toISOString()}  ${h.actor}  ${h.reason ?? ''}  [${ops.join(', ')}]`,
      );
    }
    return 0;
  });
}

/** `cairn checkpoint list <task>` and `cairn checkpoint verify <task>`: digest, signature and chain of each. */
export async function checkpointCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: { json: { type: 'boolean' }, keyring: { type: 'string' } },
  });
  const [sub, taskId] = positionals;
  if ((sub !== 'list' && sub !== 'verify') || !taskId) {
    throw new UsageError('usage: cairn checkpoint list|verify <task_id> [--keyring F] [--json]');
  }
  return withDb(async (db) => {
    const { checkpointer: checkpoints } = checkpointerFromEnv(db, values.keyring);
    const list = await checkpoints.list(taskId);
    const rows = [];
    let bad = 0;
    let unavailable = 0;
    for (let i = 0; i < list.length; i++) {
      const c = list[i]!;
      const v = sub === 'verify' ? await checkpoints.verify(c, list[i + 1]) : undefined;
      if (v && !v.ok) {
        if (v.reason === 'unavailable') unavailable++;
        else bad++;
      }
      rows.push({
        seq: c.seq,
        checkpoint_id: c.checkpoint.checkpoint_id,
        state_version: c.checkpoint.state_version,
        created_at: c.checkpoint.created_at,
        reason: c.checkpoint.reason,
        ...(v
          ? {
              valid: v.ok,
              signature_checked: v.ok ? v.signatureChecked : undefined,
              unavailable: v.ok ? undefined : v.reason === 'unavailable',
              problem: v.ok ? undefined : v.message,
            }
          : {}),
      });
    }
    if (values.json) console.log(JSON.stringify(rows, null, 2));
    else {
      if (rows.length === 0) console.log(line`no checkpoints for task ${taskId}`);
      for (const r of rows) {
        // Without the key ring only digests and chain are checked, which whoever can write the
        // table can recompute: never say "ok" for that.
        const status =
          r.valid === undefined
            ? ''
            : r.valid
              ? r.signature_checked
                ? 'ok       '
                : 'signature not checked (no CAIRN_CHECKPOINT_KEYS), digests match '
              : r.unavailable
                ? `UNAVAILABLE, not checked (${r.problem}) `
                : `CORRUPT (${r.problem}) `;
        console.log(
          line`#${r.seq}  ${status}${r.checkpoint_id}  v${r.state_version}  ${r.created_at}  ${r.reason}`,
        );
      }
    }
    return bad > 0 ? ExitCode.failed : unavailable > 0 ? ExitCode.unavailable : ExitCode.ok;
  });
}
