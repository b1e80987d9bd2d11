import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import { replayDeadLetter } from '../consumers/deadLetters.js';
import { CairnError, NotFoundError, ValidationError } from '../src/errors.js';
import type { Publisher } from '../src/kafka/publisher.js';
import { OperatorReason, releaseKey, skipMessage } from '../src/outbox/operator.js';
import { createReceiptStore } from '../src/receipts/receipts.js';
import { releaseQuarantine } from '../src/recovery/failover.js';
import { placeHold, releaseHold } from '../src/retention/holds.js';
import { zodIssues } from '../src/schemas/zodIssues.js';
import type { ConsoleUser } from './auth.js';
import { type Scope, visibleReceipt } from './queries.js';

/** What an action came to: done now, found already done (or gone), refused, or still running from an earlier request. */
export type Outcome = 'done' | 'already' | 'refused' | 'in_progress';

export interface ActionResult {
  outcome: Outcome;
  /** For the operator: what happened, in one sentence. */
  message: string;
  /** The same request was sent before: this is its first answer, nothing ran again. */
  repeated: boolean;
}

const RequestId = z.uuid({ message: 'must be the request id the page put in its form (a UUID)' });
const text = (max: number) => z.string().trim().min(1).max(max);

/** Every action: its form fields, and what it does through the library (the CLI's functions). */
const ACTIONS = {
  'receipt.resolve': z.strictObject({
    receipt_id: text(200),
    outcome: z.enum(['succeeded', 'failed', 'compensated']),
    reason: OperatorReason,
  }),
  'quarantine.release': z.strictObject({ task_id: text(200) }),
  'parked.release': z.strictObject({
    topic: text(249),
    key: text(1024),
    tenant: z.string().max(63),
    reason: OperatorReason,
  }),
  'outbox.skip': z.strictObject({ message_id: z.uuid(), reason: OperatorReason }),
  'deadletter.replay': z.strictObject({ message_id: text(512), group: text(255) }),
  'hold.place': z.strictObject({ task_id: text(200), reason: OperatorReason }),
  'hold.release': z.strictObject({ task_id: text(200) }),
} as const;
export type ActionName = keyof typeof ACTIONS;
export const ACTION_NAMES = Object.keys(ACTIONS) as ActionName[];

export interface ActionContext {
  scope: Scope;
  user: ConsoleUser;
  /** To send a replayed dead letter; without one, replay is refused with a clear message. */
  publisher?: Publisher;
}

/** A fresh request id for a form: the same form sent twice carries the same one. */
export const newRequestId = (): string => randomUUID();

/**
 * Runs one operator action once per request id: the request is recorded (who, which role and
 * tenant, what, on which target) before it runs and its outcome after, so a double click or a
 * resent form answers with the first outcome instead of acting twice. A repeated command with a
 * new request id finds the state already changed and reports `already`.
 */
export async function runAction(
  ctx: ActionContext,
  name: string,
  form: Record<string, unknown>,
): Promise<ActionResult> {
  const schema = (ACTIONS as Record<string, z.ZodType>)[name];
  if (!schema)
    throw new ValidationError('console action', [
      { path: 'action', message: 'is not an action', value: name },
    ]);
  const { request_id, csrf: _csrf, ...fields } = form;
  const requestId = RequestId.safeParse(request_id);
  if (!requestId.success) {
    throw new ValidationError(name, [
      { path: 'request_id', message: requestId.error.issues[0]!.message, value: request_id },
    ]);
  }
  const parsed = schema.safeParse(fields);
  if (!parsed.success) throw new ValidationError(name, zodIssues(parsed.error, fields));
  const input = parsed.data as Record<string, string>;
  const target = targetOf(name as ActionName, input);
  const { owner } = ctx.scope;

  const claimed = await owner
    .insertInto('console_action')
    .values({
      request_id: requestId.data,
      actor: ctx.user.id,
      role: ctx.user.role,
      scope_tenant: ctx.user.tenant ?? null,
      action: name,
      target,
    })
    .onConflict((c) => c.columns(['actor', 'request_id']).doNothing())
    .returning('id')
    .executeTakeFirst();
  if (!claimed) {
    const first = await owner
      .selectFrom('console_action')
      .select(['outcome', 'detail', 'action', 'target'])
      .where('actor', '=', ctx.user.id)
      .where('request_id', '=', requestId.data)
      .executeTakeFirstOrThrow();
    if (first.action !== name || first.target !== target) {
      throw new ValidationError(name, [
        {
          path: 'request_id',
          message: 'was used for another action: reload the page',
          value: requestId.data,
        },
      ]);
    }
    return {
      outcome: first.outcome === 'pending' ? 'in_progress' : first.outcome,
      message: first.outcome === 'pending' ? 'the same request is still running' : (first.detail ?? ''),
      repeated: true,
    };
  }
  let result: { outcome: Exclude<Outcome, 'in_progress'>; message: string };
  try {
    result = await perform(ctx, name as ActionName, input);
  } catch (err) {
    // Not done: release the request id so the same form can be sent again once the cause is fixed.
    await owner.deleteFrom('console_action').where('id', '=', claimed.id).execute();
    throw err;
  }
  await owner
    .updateTable('console_action')
    .set({ outcome: result.outcome, detail: result.message, finished_at: new Date() })
    .where('id', '=', claimed.id)
    .execute();
  return { ...result, repeated: false };
}

function targetOf(name: ActionName, i: Record<string, string>): string {
  switch (name) {
    case 'receipt.resolve':
      return `receipt:${i.receipt_id}`;
    case 'parked.release':
      return `parked:${i.tenant}/${i.topic}/${i.key}`;
    case 'outbox.skip':
      return `outbox:${i.message_id}`;
    case 'deadletter.replay':
      return `dead-letter:${i.group}/${i.message_id}`;
    default:
      return `task:${i.task_id}`;
  }
}

const notVisible = (what: string, id: string) => new NotFoundError(what, id);

async function taskVisible(s: Scope, taskId: string): Promise<{ tenant_id: string }> {
  const t = await s.db
    .selectFrom('task_state')
    .select('tenant_id')
    .where('task_id', '=', taskId)
    .executeTakeFirst();
  if (!t) throw notVisible('task', taskId);
  return t;
}

/**
 * The action itself. What a tenant-bound operator may touch is checked by reading it through
 * the tenant's connection (row-level security): a row it cannot see is "not found", exactly
 * as for a row that does not exist. The change is then made as the owner, as the CLI does.
 */
async function perform(
  ctx: ActionContext,
  name: ActionName,
  i: Record<string, string>,
): Promise<{ outcome: 'done' | 'already' | 'refused'; message: string }> {
  const { scope: s, user } = ctx;
  switch (name) {
    case 'receipt.resolve': {
      const r = await visibleReceipt(s, i.receipt_id!);
      if (!r) throw notVisible('receipt', i.receipt_id!);
      if (r.status !== 'gated')
        return {
          outcome: 'already',
          message: `receipt ${r.receipt_id} is ${r.status}, not gated: nothing changed`,
        };
      try {
        await createReceiptStore({ db: s.owner }).resolveGate(r.receipt_id, {
          outcome: i.outcome as 'succeeded' | 'failed' | 'compensated',
          actor: user.id,
          reason: i.reason!,
        });
      } catch (err) {
        if (err instanceof NotFoundError)
          return { outcome: 'already', message: `receipt ${r.receipt_id} was resolved meanwhile` };
        throw err;
      }
      return {
        outcome: 'done',
        message: `receipt ${r.receipt_id} (${r.tool}, step ${r.step}) marked ${i.outcome}`,
      };
    }
    case 'quarantine.release': {
      await taskVisible(s, i.task_id!);
      const n = await releaseQuarantine(s.owner, i.task_id!, user.id);
      return n > 0
        ? { outcome: 'done', message: `task ${i.task_id} released from quarantine` }
        : { outcome: 'already', message: `task ${i.task_id} is not quarantined` };
    }
    case 'parked.release': {
      if (s.tenant !== undefined && i.tenant !== s.tenant)
        throw notVisible('parked key', `${i.topic}/${i.key}`);
      try {
        await releaseKey(s.owner, {
          topic: i.topic!,
          key: i.key!,
          tenant: i.tenant!,
          actor: user.id,
          reason: i.reason!,
        });
      } catch (err) {
        if (err instanceof NotFoundError)
          return { outcome: 'already', message: `key ${i.key} on ${i.topic} is not parked` };
        throw err;
      }
      return {
        outcome: 'done',
        message: `key ${i.key} on ${i.topic} released: its head message is tried again`,
      };
    }
    case 'outbox.skip': {
      const row = await s.db
        .selectFrom('outbox')
        .select('message_id')
        .where('message_id', '=', i.message_id!)
        .executeTakeFirst();
      if (!row)
        return {
          outcome: 'already',
          message: `message ${i.message_id} is not in the outbox (published or skipped)`,
        };
      try {
        await skipMessage(s.owner, { messageId: i.message_id!, actor: user.id, reason: i.reason! });
      } catch (err) {
        if (err instanceof NotFoundError)
          return { outcome: 'already', message: `message ${i.message_id} left the outbox meanwhile` };
        throw err;
      }
      return { outcome: 'done', message: `message ${i.message_id} skipped (dropped, audited)` };
    }
    case 'deadletter.replay': {
      const dl = await s.db
        .selectFrom('inbox_dlq')
        .select(['tenant_id', 'replayed_at'])
        .where('consumer_group', '=', i.group!)
        .where('message_id', '=', i.message_id!)
        .executeTakeFirst();
      if (!dl) throw notVisible(`dead letter of group ${i.group}`, i.message_id!);
      if (!ctx.publisher) {
        return {
          outcome: 'refused',
          message: 'no Kafka configured for the console (KAFKA_BROKERS): nothing was sent',
        };
      }
      try {
        await replayDeadLetter(s.owner, ctx.publisher, {
          messageId: i.message_id!,
          groupId: i.group!,
          tenantId: dl.tenant_id ?? '',
        });
      } catch (err) {
        if (err instanceof CairnError && err.code === 'already_applied')
          return { outcome: 'already', message: err.message };
        throw err;
      }
      return { outcome: 'done', message: `dead letter ${i.message_id} sent back for group ${i.group}` };
    }
    case 'hold.place': {
      const t = await taskVisible(s, i.task_id!);
      await placeHold(s.owner, {
        tenantId: t.tenant_id,
        taskId: i.task_id!,
        reason: i.reason!,
        actor: user.id,
      });
      return { outcome: 'done', message: `legal hold placed on task ${i.task_id}` };
    }
    case 'hold.release': {
      const t = await taskVisible(s, i.task_id!);
      const n = await releaseHold(s.owner, { tenantId: t.tenant_id, taskId: i.task_id!, actor: user.id });
      return n > 0
        ? { outcome: 'done', message: `legal hold on task ${i.task_id} released` }
        : { outcome: 'already', message: `task ${i.task_id} has no active hold of its own` };
    }
  }
}
