import { parseArgs } from 'node:util';
import { z } from 'zod';
import { TopicName } from '../src/outbox/message.js';
import {
  listParked,
  OperatorReason,
  OutboxKey,
  OutboxMessageId,
  releaseKey,
  skipMessage,
} from '../src/outbox/operator.js';
import { listPlantedRows, outboxStatus } from '../src/outbox/status.js';
import { SpiffeId } from '../src/schemas/taskState.js';
import { defaultOperator, exitTwoOnBadInput, operatorInput } from './operatorInput.js';
import { line, printResult, UsageError } from './output.js';
import { withDb } from './withDb.js';

const usage = `usage:
  cairn outbox status [--json]
  cairn outbox parked [--json]
  cairn outbox release <key> --topic <topic> [--tenant T] --reason "..." [--actor spiffe://...] [--json]
  cairn outbox skip <message_id> [--tenant T] --reason "..." [--actor spiffe://...] [--json]`;

// One schema per sub-command, keyed by the flag (or usage) name an operator typed.
const json = z.boolean().optional();
const audited = { reason: OperatorReason, actor: SpiffeId.default(defaultOperator), json };
const inputs = {
  status: z.strictObject({ json }),
  parked: z.strictObject({ json }),
  release: z.strictObject({ key: OutboxKey, topic: TopicName, tenant: z.string().optional(), ...audited }),
  skip: z.strictObject({ message_id: OutboxMessageId, tenant: z.string().optional(), ...audited }),
};

export function outboxCommand(argv: string[]): Promise<number> {
  return exitTwoOnBadInput(async () => {
    const { positionals, values } = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        topic: { type: 'string' },
        tenant: { type: 'string' },
        json: { type: 'boolean' },
        reason: { type: 'string' },
        actor: { type: 'string' },
      },
    });
    const [sub, arg, ...extra] = positionals;
    if (sub === 'status') {
      const a = operatorInput('outbox status', inputs.status, { values, extra: positionals.slice(1) });
      return withDb(async (db) => {
        const s = await outboxStatus(db);
        const planted = s.planted_rows ? await listPlantedRows(db, 20) : [];
        printResult(a.json, s, () => {
          console.log(
            line`backlog ${s.backlog} message(s), oldest ${s.oldest_unpublished_seconds ?? '-'} s; parked keys ${s.parked_keys}; relays seen in the last 30 s ${s.relays_alive}`,
          );
          for (const l of s.lanes)
            console.log(line`  ${l.owner}: ${l.lanes} lane(s), fencing tokens ${l.fencing_tokens}`);
          if (s.planted_rows) {
            console.log(
              line`${s.planted_rows} row(s) the library never writes (a lane past 31, an id past 2^53 or ahead of the id sequence), planted before migration 0012; remove each with:`,
            );
            for (const r of planted)
              console.log(
                line`  cairn outbox skip ${r.message_id}${r.tenant_id ? ` --tenant ${r.tenant_id}` : ''} --reason 'planted before 0012'`,
              );
          }
        });
        return 0;
      });
    }
    if (sub === 'parked') {
      const a = operatorInput('outbox parked', inputs.parked, { values, extra: positionals.slice(1) });
      return withDb(async (db) => {
        const rows = await listParked(db);
        printResult(a.json, rows, () => {
          if (rows.length === 0) console.log('no parked keys');
          for (const r of rows) {
            console.log(
              line`${r.tenant ? `${r.tenant}:` : ''}${r.topic}\t${r.key}\thead ${r.message_id}\t${r.waiting} waiting\tsince ${r.parked_at.toISOString()}\t${r.error}`,
            );
          }
        });
        return 0;
      });
    }
    if (sub === 'release' && arg !== undefined && values.topic !== undefined) {
      const a = operatorInput('outbox release', inputs.release, {
        values: { reason: '', ...values, key: arg },
        extra,
      });
      return withDb(async (db) => {
        const { json: _, ...release } = a;
        await releaseKey(db, release);
        printResult(a.json, { released: { topic: a.topic, key: a.key, tenant: a.tenant ?? null } }, () =>
          console.log(line`released ${a.topic}/${a.key}`),
        );
        return 0;
      });
    }
    if (sub === 'skip' && arg !== undefined) {
      const a = operatorInput('outbox skip', inputs.skip, {
        values: { reason: '', ...values, message_id: arg },
        extra,
      });
      return withDb(async (db) => {
        await skipMessage(db, {
          messageId: a.message_id,
          ...(a.tenant !== undefined ? { tenant: a.tenant } : {}),
          actor: a.actor,
          reason: a.reason,
        });
        printResult(a.json, { skipped: a.message_id }, () => console.log(line`skipped ${a.message_id}`));
        return 0;
      });
    }
    throw new UsageError(`\n${usage}`);
  });
}
