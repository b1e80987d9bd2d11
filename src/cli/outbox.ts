import { parseArgs } from 'node:util';
import { listParked, releaseKey, skipMessage } from '../outbox/operator.js';
import { outboxStatus } from '../outbox/status.js';

const usage = `usage:
  cairn outbox status [--json]
  cairn outbox parked
  cairn outbox release <key> --topic <topic> --reason "..." [--actor spiffe://...]
  cairn outbox skip <message_id> --reason "..." [--actor spiffe://...]`;

import { withDb } from './withDb.js';

export async function outboxCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      topic: { type: 'string' },
      json: { type: 'boolean' },
      reason: { type: 'string' },
      actor: { type: 'string', default: `spiffe://cairn.local/operator/${process.env.USER ?? 'unknown'}` },
    },
  });
  const [sub, arg] = positionals;
  return withDb(async (db) => {
    if (sub === 'status') {
      const s = await outboxStatus(db);
      if (values.json) console.log(JSON.stringify(s, null, 2));
      else {
        console.log(
          `backlog ${s.backlog} message(s), oldest ${s.oldest_unpublished_seconds ?? '-'} s; parked keys ${s.parked_keys}; relays seen in the last 30 s ${s.relays_alive}`,
        );
        for (const l of s.lanes)
          console.log(`  ${l.owner}: ${l.lanes} lane(s), fencing tokens ${l.fencing_tokens}`);
      }
      return 0;
    }
    if (sub === 'parked') {
      const rows = await listParked(db);
      if (rows.length === 0) console.log('no parked keys');
      for (const r of rows) {
        console.log(
          `${r.topic}\t${r.key}\thead ${r.message_id}\t${r.waiting} waiting\tsince ${r.parked_at.toISOString()}\t${r.error}`,
        );
      }
      return 0;
    }
    if (sub === 'release' && arg && values.topic) {
      await releaseKey(db, {
        topic: values.topic,
        key: arg,
        actor: values.actor!,
        reason: values.reason ?? '',
      });
      console.log(`released ${values.topic}/${arg}`);
      return 0;
    }
    if (sub === 'skip' && arg) {
      await skipMessage(db, { messageId: arg, actor: values.actor!, reason: values.reason ?? '' });
      console.log(`skipped ${arg}`);
      return 0;
    }
    console.error(usage);
    return 2;
  });
}
