import { parseArgs } from 'node:util';
import { createTaskStore } from '../src/state/taskStore.js';
import { upgradeStoredTasks } from '../src/state/upgrade.js';
import { line, UsageError } from './output.js';
import { withDb } from './withDb.js';

export async function stateCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      actor: { type: 'string', default: 'spiffe://cairn.local/cli/state-upgrade' },
      json: { type: 'boolean' },
    },
  });
  if (positionals[0] !== 'upgrade')
    throw new UsageError('usage: cairn state upgrade [--actor spiffe://...] [--json]');
  return withDb(async (db) => {
    const report = await upgradeStoredTasks({ db, store: createTaskStore({ db }), actor: values.actor! });
    if (values.json) console.log(JSON.stringify(report, null, 2));
    else {
      console.log(
        line`upgraded ${report.upgraded} task(s) to oaies.task-state.v2; ` +
          `${report.terminalLeftAsIs} terminal task(s) left as stored (upcast on read); ${report.raced} lost a race (run again)`,
      );
      console.log(JSON.stringify(report)); // the summary line scripts read before --json existed
    }
    return 0;
  });
}
