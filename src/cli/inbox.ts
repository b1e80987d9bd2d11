import { parseArgs } from 'node:util';
import { listDeadLetters, replayDeadLetter } from '../../consumers/deadLetters.js';
import { pruneInbox } from '../../consumers/sql/pruneInbox.js';
import { kafkaBrokersFromEnv } from '../env.js';
import { createKafkaPublisher } from '../kafka/publisher.js';

const usage = `usage:
  cairn inbox dlq [--group G]
  cairn inbox replay <message_id> --group G
  cairn inbox prune [--older-than-hours 168]`;

import { withDb } from './withDb.js';

export async function inboxCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: { group: { type: 'string' }, 'older-than-hours': { type: 'string', default: '168' } },
  });
  const [sub, arg] = positionals;
  return withDb(async (db) => {
    if (sub === 'dlq') {
      const rows = await listDeadLetters(db, values.group);
      if (rows.length === 0) console.log('no dead letters');
      for (const r of rows) {
        console.log(
          `${r.consumer_group}\t${r.message_id}\t${r.topic}/${r.partition}@${r.offset}\t${r.attempts} attempts\t` +
            `${r.replayed_at ? `replayed ${r.replayed_at.toISOString()}` : `dead since ${r.dead_at.toISOString()}`}\t${r.error}`,
        );
      }
      return 0;
    }
    if (sub === 'replay' && arg && values.group) {
      const r = await replayDeadLetter(db, createKafkaPublisher({ brokers: kafkaBrokersFromEnv() }), {
        messageId: arg,
        groupId: values.group,
      });
      console.log(`replayed ${r.message_id} to ${r.topic} for group ${r.consumer_group}`);
      return 0;
    }
    if (sub === 'prune') {
      const hours = Number(values['older-than-hours']);
      if (!Number.isFinite(hours) || hours <= 0) {
        console.error(
          `cairn inbox prune: --older-than-hours must be a positive number (got ${values['older-than-hours']})`,
        );
        return 2;
      }
      const removed = await pruneInbox(db, { olderThanMs: hours * 3600_000 });
      console.log(`pruned ${removed} inbox row(s) older than ${hours} h`);
      return 0;
    }
    console.error(usage);
    return 2;
  });
}
