import { parseArgs } from 'node:util';
import { z } from 'zod';
import {
  ConsumerGroupId,
  InboxMessageId,
  listDeadLetters,
  replayDeadLetter,
} from '../consumers/deadLetters.js';
import { pruneInbox } from '../consumers/sql/pruneInbox.js';
import { kafkaBrokersFromEnv } from '../src/env.js';
import { createKafkaPublisher } from '../src/kafka/publisher.js';
import { exitTwoOnBadInput, operatorInput } from './operatorInput.js';
import { line, printResult, UsageError } from './output.js';
import { withDb } from './withDb.js';

const usage = `usage:
  cairn inbox dlq [--group G] [--json]
  cairn inbox replay <message_id> --group G [--tenant T] [--json]
  cairn inbox prune [--older-than-hours 168] [--json]`;

// One schema per sub-command, keyed by the flag (or usage) name an operator typed.
const json = z.boolean().optional();
const inputs = {
  dlq: z.strictObject({ group: ConsumerGroupId.optional(), json }),
  replay: z.strictObject({
    message_id: InboxMessageId,
    group: ConsumerGroupId,
    tenant: z.string().optional(),
    json,
  }),
  prune: z.strictObject({
    json,
    'older-than-hours': z
      .string()
      .default('168')
      .refine((h) => /^\d+(\.\d+)?$/.test(h) && Number(h) > 0, { message: 'must be a positive number' })
      .transform(Number),
  }),
};

export function inboxCommand(argv: string[]): Promise<number> {
  return exitTwoOnBadInput(async () => {
    const { positionals, values } = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        group: { type: 'string' },
        tenant: { type: 'string' },
        'older-than-hours': { type: 'string' },
        json: { type: 'boolean' },
      },
    });
    const [sub, arg, ...extra] = positionals;
    if (sub === 'dlq') {
      const a = operatorInput('inbox dlq', inputs.dlq, { values, extra: positionals.slice(1) });
      return withDb(async (db) => {
        const rows = await listDeadLetters(db, a.group);
        printResult(a.json, rows, () => {
          if (rows.length === 0) console.log('no dead letters');
          for (const r of rows) {
            console.log(
              line`${r.consumer_group}\t${r.message_id}\t${r.topic}/${r.partition}@${r.offset}\t${r.attempts} attempts\t` +
                `${r.replayed_at ? `replayed ${r.replayed_at.toISOString()}` : `dead since ${r.dead_at.toISOString()}`}\t${r.error}`,
            );
          }
        });
        return 0;
      });
    }
    if (sub === 'replay' && arg !== undefined && values.group !== undefined) {
      const a = operatorInput('inbox replay', inputs.replay, {
        values: { ...values, message_id: arg },
        extra,
      });
      return withDb(async (db) => {
        const r = await replayDeadLetter(db, createKafkaPublisher({ brokers: kafkaBrokersFromEnv() }), {
          messageId: a.message_id,
          groupId: a.group,
          ...(a.tenant !== undefined ? { tenantId: a.tenant } : {}),
        });
        printResult(a.json, { replayed: r }, () =>
          console.log(line`replayed ${r.message_id} to ${r.topic} for group ${r.consumer_group}`),
        );
        return 0;
      });
    }
    if (sub === 'prune') {
      const a = operatorInput('inbox prune', inputs.prune, { values, extra: positionals.slice(1) });
      const hours = a['older-than-hours'];
      return withDb(async (db) => {
        const removed = await pruneInbox(db, { olderThanMs: hours * 3600_000 });
        printResult(a.json, { pruned: removed, older_than_hours: hours }, () =>
          console.log(line`pruned ${removed} inbox row(s) older than ${hours} h`),
        );
        return 0;
      });
    }
    throw new UsageError(`\n${usage}`);
  });
}
