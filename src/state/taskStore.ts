import type { z } from 'zod';
import { boundaryOf } from '../checkpoints/boundaries.js';
import { assertNoCredentials } from '../checkpoints/secrets.js';
import { type Executor, inTransaction, type Trx } from '../db/executor.js';
import { mapSqlError, rethrowMapped, SqlState, sqlState } from '../db/sqlstate.js';
import { CairnError, LeaseLostError, NotFoundError, StaleWriteError, ValidationError } from '../errors.js';
import { holdsFence } from '../leases/sql/fenceCheck.js';
import { silentLogger } from '../logger.js';
import { parseOptions, refuseUnknownKeys } from '../options.js';
import { createOutbox } from '../outbox/outbox.js';
import { NewTask, TaskPatch } from '../schemas/taskPatch.js';
import {
  GATES,
  type GateName,
  SPIFFE_ID,
  SpiffeId,
  TASK_STATE_V2,
  type TaskState,
  TaskStateV2,
} from '../schemas/taskState.js';
import { zodIssues } from '../schemas/zodIssues.js';
import { createChangelogWriter } from './changelog.js';
import { createFieldCrypto } from './fieldCrypto.js';
import { parseStoredTaskState } from './parseStored.js';
import { asStored, diff } from './replay.js';
import { assertChangeAllowed } from './rules.js';
import { casUpdate } from './sql/casUpdate.js';
import {
  type AuditRow,
  StoreOptions,
  type TaskStore,
  type TaskStoreOptions,
  UPDATE_KEYS,
  type UpdateInput,
  type UpdateResult,
} from './taskStoreTypes.js';
import { noteStatusChange, withUpdateSpans } from './updateSpan.js';

export type { AuditRow, TaskStore, TaskStoreOptions, UpdateInput, UpdateResult };

/**
 * Makes a TaskStore. It holds no connection or timer of its own (only a cache of recent
 * documents), so it has nothing to close.
 */
export function createTaskStore(options: TaskStoreOptions): TaskStore {
  const o = parseOptions('task store options', StoreOptions, options);
  const log = (o.logger ?? silentLogger).child({ component: 'task-store' });
  const outbox = o.outbox ?? createOutbox();
  const changelog = o.changelog
    ? createChangelogWriter({ ...o.changelog, keys: o.changelog.keys ?? o.keys }, outbox)
    : undefined;

  const fields =
    o.keys || o.classification
      ? createFieldCrypto({
          ...(o.keys ? { keys: o.keys } : {}),
          ...(o.classification ? { classification: o.classification } : {}),
        })
      : undefined;
  const seal = (ex: Executor, next: TaskState, prev?: Known) => (fields ? fields.seal(ex, next, prev) : next);
  const open = (ex: Executor, stored: TaskState) => (fields ? fields.open(ex, stored) : stored);

  /** A document as this store knows it: what it stored, and its plaintext (the same without field encryption). */
  interface Known {
    stored: TaskState;
    plain: TaskState;
    /** stateDigest(stored), when this store wrote it with the changelog on. */
    digest?: string;
  }
  const recent = new Map<string, Known>();
  function remember(plain: TaskState, stored: TaskState, digest?: string): void {
    recent.delete(plain.task_id);
    recent.set(plain.task_id, { plain, stored, ...(digest ? { digest } : {}) });
    if (recent.size > o.cacheSize) recent.delete(recent.keys().next().value as string);
  }

  async function readRow(ex: Executor, taskId: string) {
    return ex
      .selectFrom('task_state')
      .select(['task_id', 'tenant_id', 'version', 'schema_version', 'doc'])
      .where('task_id', '=', taskId)
      .executeTakeFirst()
      .catch(rethrowMapped); // an unmigrated database: "run cairn migrate"
  }

  return withUpdateSpans({
    async create({ task, actor, reason, trx }) {
      checkActor(actor);
      const input = parse('new task', NewTask, task);
      assertNoCredentials(`new task ${input.task_id}`, input);
      assertNoCredentials(`the reason for new task ${input.task_id}`, reason);
      const created = inTransaction(o.db, trx, async (t) => {
        const now = o.clock().toISOString();
        const state = asStored(
          parse('task state', TaskStateV2, {
            schema_version: TASK_STATE_V2,
            tenant_id: input.tenant_id,
            task_id: input.task_id,
            version: 1,
            status: input.status ?? 'planning',
            gates: { ...allGates(false), ...input.gates },
            artifacts: input.artifacts ?? {},
            active_agents: input.active_agents ?? [],
            completed_agents: [],
            failed_agents: [],
            budget: input.budget ?? {
              currency_committed_usd: 0,
              currency_spent_usd: 0,
              tokens_spent: 0,
              hops_used: 0,
            },
            workflow_digest: input.workflow_digest,
            intent_id: input.intent_id,
            updated_at: now,
            updated_by: actor,
          }),
        );
        fields?.assertChangeNotCopied(state, reason, undefined);
        const stored = await seal(t, state);
        try {
          await t
            .insertInto('task_state')
            .values({
              task_id: state.task_id,
              tenant_id: state.tenant_id,
              version: 1,
              schema_version: TASK_STATE_V2,
              status: state.status,
              doc: JSON.stringify(stored),
            })
            .execute();
        } catch (err) {
          if (sqlState(err) === SqlState.uniqueViolation) {
            throw new CairnError(
              'already_exists',
              `task ${state.task_id} already exists; use update() to change it`,
              {
                cause: err,
              },
            );
          }
          throw err;
        }
        const patch = diff({}, stored);
        await insertAudit(t, state, null, actor, reason ?? 'created', patch);
        if (o.checkpointer) await o.checkpointer.take(t, { state, reason: 'task created', createdBy: actor });
        // After the checkpoint: the record is not pending work of the task's (failoverMirror.ts).
        await changelog?.write(t, {
          tenantId: state.tenant_id,
          taskId: state.task_id,
          version: 1,
          prevVersion: null,
          actor,
          reason: reason ?? 'created',
          patch,
          prevStored: null,
          nextStored: stored,
          messages: [],
        });
        log.debug({ task_id: state.task_id, version: 1 }, 'task created');
        if (!trx) remember(state, stored);
        return state;
      });
      return created.catch(rethrowMapped);
    },

    async get(taskId, opts = {}) {
      const ex = opts.trx ?? o.db;
      const row = await readRow(ex, taskId);
      if (!row) return undefined;
      const stored = parseStoredTaskState(row);
      const state = await open(ex, stored);
      // Not what a caller's transaction read: it may roll back, and a copy of it would let a
      // later update's CAS pass against a row that never held it (review).
      if (row.doc.schema_version === TASK_STATE_V2 && !opts.trx) remember(state, stored);
      return state;
    },

    async update(input) {
      refuseUnknownKeys('task update', input, UPDATE_KEYS, { fence: 'lease' });
      checkActor(input.actor);
      const patch = parse(`patch for task ${input.taskId}`, TaskPatch, input.patch);
      const ex = input.trx ?? o.db;
      // The last document this store wrote or read for the task saves a round trip; the CAS
      // checks its version and updated_at, so a stale copy can only cause a stale result.
      let known = recent.get(input.taskId);
      let storedDoc: unknown = known?.stored;
      if (!known || known.plain.version !== input.expectedVersion) {
        const row = await readRow(ex, input.taskId);
        if (!row) throw new NotFoundError('task', input.taskId);
        if (row.version !== input.expectedVersion)
          return stale(input.taskId, input.expectedVersion, row.version);
        const stored = parseStoredTaskState(row);
        known = { stored, plain: await open(ex, stored) };
        storedDoc = row.doc;
      }
      const prev = known.plain;
      const next = asStored(
        parse(`task ${input.taskId} after the patch`, TaskStateV2, {
          ...prev,
          ...patch,
          gates: { ...prev.gates, ...patch.gates },
          artifacts: { ...prev.artifacts, ...patch.artifacts },
          budget: { ...prev.budget, ...patch.budget },
          version: prev.version + 1,
          updated_at: o.clock().toISOString(),
          updated_by: input.actor,
        }),
      );
      checkWriteOnce(prev, next);
      noteStatusChange(prev, next);
      assertNoCredentials(`task ${input.taskId}`, patch);
      assertNoCredentials(`the reason for task ${input.taskId}'s change`, input.reason);
      assertNoCredentials(`the checkpoint of task ${input.taskId}'s change`, input.checkpoint);
      assertChangeAllowed(prev, next, { reason: input.reason, requiredGates: o.requiredGates });
      fields?.assertChangeNotCopied(next, input.reason, input.messages);
      const nextStored = await seal(ex, next, known);
      // Against the document as stored: for a v1 row the patch shows the upgrade too.
      const auditPatch = diff(storedDoc as object, nextStored);

      const cas = (on: Executor) =>
        casUpdate(
          on,
          {
            taskId: input.taskId,
            tenantId: next.tenant_id,
            expectedVersion: input.expectedVersion,
            expectedUpdatedAt: prev.updated_at,
            status: next.status,
            schemaVersion: TASK_STATE_V2,
            doc: nextStored,
            audit: { actor: input.actor, reason: input.reason ?? null, patch: auditPatch },
          },
          { coalesce: o.coalesceUpdates },
        );
      let swapped: boolean;
      let messageIds: string[] = [];
      let digest: string | undefined;
      try {
        const boundary = o.checkpointer ? boundaryOf(prev, next, input.reason) : undefined;
        const checkpoint = input.checkpoint ?? (boundary ? { reason: boundary } : undefined);
        if (checkpoint && !o.checkpointer) {
          throw new ValidationError('update', [
            {
              path: 'checkpoint',
              message: 'this task store has no checkpointer (pass one to createTaskStore)',
            },
          ]);
        }
        if (input.messages?.length || input.lease || checkpoint || changelog) {
          // Validate the messages before touching the database; then the fence check, the CAS
          // and the messages in one transaction.
          const ctx = {
            defaultKey: next.task_id,
            taskId: next.task_id,
            taskVersion: next.version,
            tenantId: next.tenant_id,
          };
          const rows = input.messages?.length ? outbox.prepare(input.messages, ctx) : [];
          swapped = await inTransaction(o.db, input.trx, async (t) => {
            if (input.lease && !(await holdsFence(t, input.lease))) {
              throw new LeaseLostError(
                `task ${input.taskId}: lease ${input.lease.branch} with fencing token ${input.lease.fencingToken} ` +
                  'is no longer current (expired or taken over); nothing was written',
              );
            }
            if (!(await cas(t))) return false;
            messageIds = await outbox.insert(t, rows);
            if (checkpoint)
              await o.checkpointer!.take(t, { createdBy: input.actor, ...checkpoint, state: next });
            // After the checkpoint: the record is not pending work of the task's.
            digest = await changelog?.write(t, {
              tenantId: next.tenant_id,
              taskId: next.task_id,
              version: next.version,
              prevVersion: prev.version,
              actor: input.actor,
              reason: input.reason ?? null,
              patch: auditPatch,
              prevStored: storedDoc,
              ...(known.stored === storedDoc && known.digest ? { prevDigest: known.digest } : {}),
              nextStored,
              messages: rows,
            });
            return true;
          });
        } else {
          swapped = await cas(ex);
        }
      } catch (err) {
        recent.delete(input.taskId);
        throw mapSqlError(err);
      }
      if (!swapped) {
        recent.delete(input.taskId);
        const current = await readRow(ex, input.taskId);
        return stale(input.taskId, input.expectedVersion, current?.version);
      }
      if (!input.trx) remember(next, nextStored, digest); // a caller's transaction may still roll back
      log.debug({ task_id: next.task_id, version: next.version, status: next.status }, 'task updated');
      return { ok: true as const, state: next, messageIds };
    },

    async history(taskId, opts = {}) {
      const rows = await (opts.trx ?? o.db)
        .selectFrom('task_audit')
        .select(['task_id', 'version', 'prev_version', 'actor', 'reason', 'patch', 'at'])
        .where('task_id', '=', taskId)
        .orderBy('version')
        .execute()
        .catch(rethrowMapped);
      return rows as AuditRow[];
    },
  });
}

async function insertAudit(
  t: Trx,
  state: TaskState,
  prevVersion: number | null,
  actor: string,
  reason: string | null,
  patch: unknown[],
): Promise<void> {
  await t
    .insertInto('task_audit')
    .values({
      task_id: state.task_id,
      version: state.version,
      prev_version: prevVersion,
      tenant_id: state.tenant_id,
      actor,
      reason,
      patch: JSON.stringify(patch),
    })
    .execute();
}

function stale(taskId: string, expectedVersion: number, currentVersion: number | undefined): UpdateResult {
  return {
    ok: false,
    reason: 'stale_version',
    expectedVersion,
    currentVersion,
    error: new StaleWriteError(taskId, expectedVersion, currentVersion),
  };
}

function allGates(value: boolean): Record<GateName, boolean> {
  return Object.fromEntries(GATES.map((g) => [g, value])) as Record<GateName, boolean>;
}

function checkActor(actor: string): void {
  // SpiffeId's own checks (a string of at most 2,048 characters matching SPIFFE_ID) first:
  // zod's parse on every update cost more than the test; it still words the error.
  if (typeof actor === 'string' && actor.length <= 2048 && SPIFFE_ID.test(actor)) return;
  const r = SpiffeId.safeParse(actor);
  if (!r.success) {
    throw new ValidationError('actor', [
      {
        path: 'actor',
        message: 'must be a SPIFFE ID of the form spiffe://<trust-domain>/<path>',
        value: actor,
      },
    ]);
  }
}

/** workflow_digest and intent_id identify what the task is for: set once, never rewritten. */
function checkWriteOnce(prev: TaskState, next: TaskState): void {
  for (const key of ['workflow_digest', 'intent_id'] as const) {
    if (prev[key] !== null && prev[key] !== next[key]) {
      throw new ValidationError(`change to task ${prev.task_id}`, [
        {
          path: key,
          message: `is set once and never changes (is ${JSON.stringify(prev[key])})`,
          value: next[key],
        },
      ]);
    }
  }
}

function parse<S extends z.ZodType>(what: string, schema: S, input: unknown): z.output<S> {
  const r = schema.safeParse(input);
  if (!r.success) throw new ValidationError(what, zodIssues(r.error, input));
  return r.data;
}
