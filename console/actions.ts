import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { z } from 'zod';
import { replayDeadLetter } from '../consumers/deadLetters.js';
import { CairnError, messageOf, NotFoundError, ValidationError } from '../src/errors.js';
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
/** A reason as typed, without the spaces around it: "lit " and "lit" are the same reason. */
const reason = z.string().trim().pipe(OperatorReason);
/** Whose row: a tenant id, or '' for a row of no tenant (the form says; a tenant-bound user's own tenant wins). */
const tenant = z.string().max(63);

/** Every action: its form fields, and what it does through the library (the CLI's functions). */
const ACTIONS = {
  'receipt.resolve': z.strictObject({
    receipt_id: z.uuid({ message: 'must be a receipt id (a UUID)' }),
    outcome: z.enum(['succeeded', 'failed', 'compensated']),
    reason,
  }),
  'quarantine.release': z.strictObject({ task_id: text(200) }),
  'parked.release': z.strictObject({
    topic: text(249),
    key: text(1024),
    tenant,
    reason,
  }),
  'outbox.skip': z.strictObject({ message_id: z.uuid(), tenant, reason }),
  'deadletter.replay': z.strictObject({ message_id: text(512), group: text(255), tenant }),
  'hold.place': z.strictObject({ task_id: text(200), reason }),
  'hold.release': z.strictObject({ task_id: text(200) }),
} as const;
export type ActionName = keyof typeof ACTIONS;
export const ACTION_NAMES = Object.keys(ACTIONS) as ActionName[];

export interface ActionContext {
  scope: Scope;
  user: ConsoleUser;
  /** A publisher per replayed dead letter (each is connected and closed by the replay); without it, replay is refused. */
  publisher?: () => Publisher;
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

  const claimed = await claim(ctx, requestId.data, name, target);
  if ('repeated' in claimed) return claimed;
  let result: { outcome: Exclude<Outcome, 'in_progress'>; message: string };
  try {
    result = await perform(ctx, name as ActionName, input);
  } catch (err) {
    // Not done, or not known to be done: recorded as failed (the same form may be sent again).
    await owner
      .updateTable('console_action')
      .set({ outcome: 'failed', detail: messageOf(err).slice(0, 2000), finished_at: new Date() })
      .where('id', '=', claimed.id)
      .execute()
      .catch(() => {}); // the database may be what failed: the row stays pending, and is taken again later
    throw err;
  }
  await owner
    .updateTable('console_action')
    .set({ outcome: result.outcome, detail: result.message, finished_at: new Date() })
    .where('id', '=', claimed.id)
    .execute();
  return { ...result, repeated: false };
}

/** A request left pending this long was abandoned (its process died, its database went away): it may run again. */
const ABANDONED_MS = 120_000;

/**
 * Records the request before it runs. A request seen before answers with its first outcome;
 * one that failed, or was abandoned while pending, is taken again (every action checks the
 * state it changes, so running it again after a partial run does no harm).
 */
async function claim(
  ctx: ActionContext,
  requestId: string,
  name: string,
  target: string,
): Promise<{ id: number } | ActionResult> {
  const { owner } = ctx.scope;
  const inserted = await owner
    .insertInto('console_action')
    .values({
      request_id: requestId,
      actor: ctx.user.id,
      role: ctx.user.role,
      scope_tenant: ctx.user.tenant ?? null,
      action: name,
      target,
    })
    .onConflict((c) => c.columns(['actor', 'request_id']).doNothing())
    .returning('id')
    .executeTakeFirst();
  if (inserted) return inserted;
  const first = await owner
    .selectFrom('console_action')
    .select([
      'id',
      'outcome',
      'detail',
      'action',
      'target',
      sql<boolean>`at < now() - ${`${ABANDONED_MS} milliseconds`}::interval`.as('abandoned'),
    ])
    .where('actor', '=', ctx.user.id)
    .where('request_id', '=', requestId)
    .executeTakeFirstOrThrow();
  if (first.action !== name || first.target !== target) {
    throw new ValidationError(name, [
      { path: 'request_id', message: 'was used for another action: reload the page', value: requestId },
    ]);
  }
  if (first.outcome === 'failed' || (first.outcome === 'pending' && first.abandoned)) {
    const retaken = await owner
      .updateTable('console_action')
      .set({ outcome: 'pending', at: sql`now()`, detail: null, finished_at: null })
      .where('id', '=', first.id)
      .where('outcome', '=', first.outcome)
      .returning('id')
      .executeTakeFirst();
    if (retaken) return retaken;
  }
  if (first.outcome === 'pending' || first.outcome === 'failed') {
    return { outcome: 'in_progress', message: 'the same request is still running', repeated: true };
  }
  return { outcome: first.outcome, message: first.detail ?? '', repeated: true };
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
      // The quarantine row itself must be this operator's to see: one recorded for no tenant
      // (a task the failover found gone) is not a tenant's to release, whoever wrote a task
      // under that id since.
      const q = await s.db
        .selectFrom('task_quarantine')
        .select('tenant_id')
        .where('task_id', '=', i.task_id!)
        .where('released_at', 'is', null)
        .executeTakeFirst();
      const n = q ? await releaseQuarantine(s.owner, i.task_id!, user.id, { tenantId: q.tenant_id }) : 0;
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
      const whose = s.tenant ?? i.tenant!;
      const row = await s.db
        .selectFrom('outbox')
        .select('message_id')
        .where('message_id', '=', i.message_id!)
        .where(sql<boolean>`coalesce(tenant_id, '') = ${whose}`)
        .executeTakeFirst();
      if (!row)
        return {
          outcome: 'already',
          message: `message ${i.message_id} is not in the outbox (published or skipped)`,
        };
      try {
        await skipMessage(s.owner, {
          messageId: i.message_id!,
          tenant: whose,
          actor: user.id,
          reason: i.reason!,
        });
      } catch (err) {
        if (err instanceof NotFoundError)
          return { outcome: 'already', message: `message ${i.message_id} left the outbox meanwhile` };
        throw err;
      }
      return { outcome: 'done', message: `message ${i.message_id} skipped (dropped, audited)` };
    }
    case 'deadletter.replay': {
      const whose = s.tenant ?? i.tenant!;
      const dl = await s.db
        .selectFrom('inbox_dlq')
        .select(['replayed_at'])
        .where('consumer_group', '=', i.group!)
        .where('message_id', '=', i.message_id!)
        .where(sql<boolean>`coalesce(tenant_id, '') = ${whose}`)
        .executeTakeFirst();
      if (!dl) throw notVisible(`dead letter of group ${i.group}`, i.message_id!);
      if (dl.replayed_at) {
        return {
          outcome: 'already',
          message: `dead letter ${i.message_id} was sent back at ${dl.replayed_at.toISOString()}`,
        };
      }
      if (!ctx.publisher) {
        return {
          outcome: 'refused',
          message: 'no Kafka configured for the console (KAFKA_BROKERS): nothing was sent',
        };
      }
      try {
        await replayDeadLetter(s.owner, ctx.publisher(), {
          messageId: i.message_id!,
          groupId: i.group!,
          tenantId: whose,
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
      const hold = await placeHold(s.owner, {
        tenantId: t.tenant_id,
        taskId: i.task_id!,
        reason: i.reason!,
        actor: user.id,
      });
      return hold.created
        ? { outcome: 'done', message: `legal hold placed on task ${i.task_id}` }
        : { outcome: 'already', message: `task ${i.task_id} is already held for this reason` };
    }
    case 'hold.release': {
      const t = await taskVisible(s, i.task_id!);
      // Holds are placed against a tenant as often as for it (litigation): the tenant's own
      // operator may place one, never release one.
      if (s.tenant !== undefined) {
        return {
          outcome: 'refused',
          message: `a legal hold is released by an operator bound to no tenant: the hold on task ${i.task_id} stays`,
        };
      }
      const n = await releaseHold(s.owner, { tenantId: t.tenant_id, taskId: i.task_id!, actor: user.id });
      return n > 0
        ? { outcome: 'done', message: `legal hold on task ${i.task_id} released` }
        : { outcome: 'already', message: `task ${i.task_id} has no active hold of its own` };
    }
  }
}
