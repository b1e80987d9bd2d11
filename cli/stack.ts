import { parseArgs } from 'node:util';
import { exitTwoOnBadInput } from './operatorInput.js';
import { printResult, UsageError } from './output.js';
import { down, printStackStatus, stackStatus, up } from './stack/commands.js';

const usage = `usage:
  cairn stack up [--brokers 3]
                        check Postgres, start the local Kafka broker (a no-op if it runs);
                        --brokers N: a local cluster of N nodes instead (replication 3, min ISR 2)
  cairn stack down      stop the broker(s) the local stack started
  cairn stack status [--json]
                        whether Postgres and each Kafka broker answer, the local broker's pid;
                        exit 1 if one does not`;

/** `cairn stack up|down|status`: the same as `npm run stack:*`. */
export function stackCommand(argv: string[]): Promise<number> {
  return exitTwoOnBadInput(async () => {
    const { positionals, values } = parseArgs({
      args: argv,
      allowPositionals: true,
      options: { json: { type: 'boolean' }, brokers: { type: 'string' } },
    });
    const [sub, ...extra] = positionals;
    if (extra.length > 0) throw new UsageError(`unexpected argument(s) ${extra.join(' ')}\n${usage}`);
    if (sub === 'status') {
      const status = await stackStatus();
      printResult(values.json, status, () => printStackStatus(status));
      return status.ok ? 0 : 1;
    }
    if (values.json) throw new UsageError(`--json: only \`cairn stack status\` prints data\n${usage}`);
    const brokers = values.brokers === undefined ? undefined : Number(values.brokers);
    if (brokers !== undefined && (!Number.isInteger(brokers) || brokers < 1 || brokers > 9)) {
      throw new UsageError(`--brokers must be a whole number from 1 to 9, not "${values.brokers}"\n${usage}`);
    }
    if (brokers !== undefined && sub !== 'up')
      throw new UsageError(`--brokers: only \`cairn stack up\` takes it\n${usage}`);
    if (sub === 'up') await up(brokers);
    else if (sub === 'down') await down();
    else throw new UsageError(`\n${usage}`);
    return 0;
  });
}
