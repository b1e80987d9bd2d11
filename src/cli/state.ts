import { parseArgs } from 'node:util';
import { createTaskStore } from '../state/taskStore.js';
import { upgradeStoredTasks } from '../state/upgrade.js';
import { withDb } from './withDb.js';

export async function stateCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: { actor: { type: 'string', default: 'spiffe://cairn.local/cli/state-upgrade' } },
  });
  if (positionals[0] !== 'upgrade') {
    console.error('usage: cairn state upgrade [--actor spiffe://...]');
    return 2;
  }
  return withDb(async (db) => {
    const report = await upgradeStoredTasks({ db, store: createTaskStore({ db }), actor: values.actor! });
    console.log(
      `upgraded ${report.upgraded} task(s) to oaies.task-state.v2; ` +
        `${report.terminalLeftAsIs} terminal task(s) left as stored (upcast on read); ${report.raced} lost a race (run again)`,
    );
    console.log(JSON.stringify(report));
    return 0;
  });
}
