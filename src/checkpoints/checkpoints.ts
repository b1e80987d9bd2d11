import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { canonicalBytes, sha256 } from '../canonical.js';
import type { TenantKeys } from '../crypto/tenantKeys.js';
import type { Db } from '../db/database.js';
import type { Executor, Trx } from '../db/executor.js';
import { CairnError, ValidationError } from '../errors.js';
import { parseOptions } from '../options.js';
import type { TaskState } from '../schemas/taskState.js';
import { zodIssues } from '../schemas/zodIssues.js';
import { parseStoredTaskState } from '../state/parseStored.js';
import {
  type Classification,
  classifySnapshot,
  confidentialWithoutKeys,
  DEFAULT_CLASSIFICATION,
  validateClassification,
} from './classification.js';
import { CheckpointerOptionsSchema } from './options.js';
import {
  CHECKPOINT_V1,
  CHECKPOINT_V2,
  type Checkpoint,
  CheckpointV1,
  CheckpointV2,
  upcastCheckpointV1,
} from './schema.js';
import { assertNoCredentials } from './secrets.js';
import { type KeyRing, sign, signedBytes, verifySignature } from './signing.js';
import { createPgSnapshotStore, type SnapshotStore } from './snapshotStore.js';

/**
 * A checkpoint to take: the task state, why, by whom, and the digests and ids that tie it
 * to its inputs and outputs.
 */
export interface TakeCheckpointInput {
  state: TaskState;
  reason: string;
  createdBy: string;
  inputDigest?: string;
  outputDigest?: string;
  lastMessageId?: string;
  delegationHash?: string;
  policyVersion?: string;
}

/** A checkpoint as listed: the document, its place in the task's chain and its digest. */
export interface StoredCheckpoint {
  checkpoint: Checkpoint;
  seq: number;
  digest: string;
  /**
   * The row is stored as oaies.checkpoint.v1 (its schema_version column) and was upcast when
   * read. Never taken from the document (its free-text reason says anything its writer liked).
   */
  legacy: boolean;
}

/**
 * What `verify` concluded. `reason: 'invalid'`: the checkpoint is corrupt, forged or
 * unsigned where a signature is required; `message` says which check failed.
 * `reason: 'unavailable'`: it could not be checked because a dependency is down (a key, the
 * key provider, the database): an outage, not corruption; nothing may be concluded.
 * `signatureChecked`: false when no key ring was configured (then only digests and chain
 * were checked, which anyone who can write the table can recompute).
 */
export type Verification =
  | { ok: true; state: TaskState; signatureChecked: boolean }
  | { ok: false; reason: 'invalid' | 'unavailable'; message: string };

const invalid = (message: string): Verification => ({ ok: false, reason: 'invalid', message });

/**
 * Takes signed, chained snapshots of a task at semantic boundaries, and verifies them for
 * resume.
 */
export interface Checkpointer {
  /** Takes a checkpoint inside `trx`, the transaction of the change that crossed the boundary. */
  take(trx: Trx, input: TakeCheckpointInput): Promise<Checkpoint>;
  /** Newest first; v1 documents are upcast. */
  list(taskId: string): Promise<StoredCheckpoint[]>;
  /** Digest of the snapshot bytes, signature, and the link to the previous checkpoint. */
  verify(stored: StoredCheckpoint, previous: StoredCheckpoint | undefined): Promise<Verification>;
}

/** What createCheckpointer takes. */
export interface CheckpointerOptions {
  db: Db;
  snapshots?: SnapshotStore;
  keyRing?: KeyRing;
  /**
   * Tenant data keys: snapshots are then stored encrypted (AES-256-GCM, the key id beside
   * them) and classified with DEFAULT_CLASSIFICATION unless `classification` says otherwise.
   */
  keys?: TenantKeys;
  /** Field classes of the snapshot; without keys, a snapshot holding confidential fields is refused. */
  classification?: Classification;
  /**
   * With a key ring, unsigned and v1 (legacy) checkpoints are refused, since anyone with
   * INSERT on the table can write one; set this to accept legacy rows written before signing
   * was configured. Without a key ring nothing is signed and this changes nothing.
   */
  allowLegacyCheckpoints?: boolean;
}

/**
 * A named point where a crash test kills the process. Internal: no entry point exports it;
 * tests reach it through `createCheckpointerWithTestHooks`.
 */
export interface CheckpointerTestHooks {
  /** After the checkpoint rows are written, before the transaction commits. */
  afterInsert?(): void;
}

/** Makes a Checkpointer. It holds no connection or timer of its own, so it has nothing to close. */
export function createCheckpointer(options: CheckpointerOptions): Checkpointer {
  return createCheckpointerWithTestHooks(options, {});
}

/** Internal: `createCheckpointer` with a hook at a named point, for crash tests. */
export function createCheckpointerWithTestHooks(
  input: CheckpointerOptions,
  hooks: CheckpointerTestHooks,
): Checkpointer {
  const options = parseOptions('checkpointer options', CheckpointerOptionsSchema, input);
  const { db } = options;
  const snapshots = options.snapshots ?? createPgSnapshotStore(db);
  const classification = options.classification
    ? validateClassification(options.classification)
    : options.keys
      ? DEFAULT_CLASSIFICATION
      : undefined;

  /** The snapshot's plaintext bytes (decrypted with the tenant's key when encrypted). */
  async function snapshotBytes(uri: string, taskId: string): Promise<Buffer | undefined> {
    const s = await snapshots.get(uri);
    if (!s || s.keyId === null) return s?.bytes;
    if (!options.keys) {
      throw new CairnError(
        'key_missing',
        `snapshot ${uri} is encrypted (key ${s.keyId}) and this checkpointer has no tenant keys`,
      );
    }
    return options.keys.open(s.tenantId ?? '', s.keyId, s.bytes, `snapshot:${taskId}`);
  }

  async function pendingWork(trx: Executor, taskId: string) {
    const [messages, leases, receipts] = await Promise.all([
      // This task's messages: those its changes enqueued (task_id), and untagged ones keyed by it
      // of its own tenant. Never by key alone: another tenant may key a message by this task's id.
      sql<{ message_id: string }>`
        SELECT o.message_id FROM outbox o
         WHERE o.task_id = ${taskId}
            OR (o.task_id IS NULL AND o.key = ${taskId}
                -- Of the task's tenant, or of none (only the owner writes such rows). Plain
                -- comparisons, so the (tenant_id, key) index serves them, not a scan of the outbox.
                AND (o.tenant_id = (SELECT t.tenant_id FROM task_state t WHERE t.task_id = ${taskId})
                     OR o.tenant_id IS NULL))
         ORDER BY o.id`
        .execute(trx)
        .then((r) => r.rows),
      sql<{ holder: string; lease_id: string }>`
        SELECT holder, lease_id FROM task_lease WHERE task_id = ${taskId} AND holder IS NOT NULL AND expires_at > now()
      `.execute(trx),
      trx
        .selectFrom('tool_receipt')
        .select(['receipt_id', 'worker', 'status'])
        .where('task_id', '=', taskId)
        .orderBy('started_at')
        .execute(),
    ]);
    return {
      pending: [
        ...messages.map((m) => ({ agent_id: 'relay', message_id: m.message_id })),
        ...leases.rows.map((l) => ({ agent_id: l.holder, lease_id: l.lease_id })),
        ...receipts
          .filter((r) => r.status === 'started' || r.status === 'uncertain')
          .map((r) => ({ agent_id: r.worker, receipt_id: r.receipt_id })),
      ],
      receiptIds: receipts.map((r) => r.receipt_id),
    };
  }

  function parseDoc(
    row: { doc: Record<string, unknown>; schema_version: string },
    snapshotBudget?: TaskState['budget'],
  ) {
    if (row.schema_version === CHECKPOINT_V1) {
      const r = CheckpointV1.safeParse(row.doc);
      if (!r.success) throw new ValidationError('stored checkpoint (v1)', zodIssues(r.error, row.doc));
      return upcastCheckpointV1(r.data, snapshotBudget);
    }
    const r = CheckpointV2.safeParse(row.doc);
    if (!r.success) throw new ValidationError('stored checkpoint', zodIssues(r.error, row.doc));
    return r.data;
  }

  return {
    async take(trx, input) {
      const state = input.state;
      assertNoCredentials(`checkpoint of task ${state.task_id}`, state);
      // Serialize checkpoints of one task (the CAS already holds this lock when called from an update).
      await sql`SELECT 1 FROM task_state WHERE task_id = ${state.task_id} FOR UPDATE`.execute(trx);
      const prev = await trx
        .selectFrom('checkpoint')
        .select(['seq', 'digest'])
        .where('task_id', '=', state.task_id)
        .orderBy('seq', 'desc')
        .limit(1)
        .executeTakeFirst();
      const { stored, dataClass } = classification
        ? classifySnapshot(state, classification)
        : { stored: state, dataClass: 'internal' as const };
      if (dataClass === 'confidential' && !options.keys) throw confidentialWithoutKeys(state.task_id);
      const bytes = canonicalBytes(stored);
      const sealed = options.keys
        ? await options.keys.seal(state.tenant_id, bytes, `snapshot:${state.task_id}`, trx)
        : undefined;
      const uri = sealed
        ? await snapshots.put(trx, state.task_id, sealed.bytes, { keyId: sealed.keyId })
        : await snapshots.put(trx, state.task_id, bytes);
      const { pending, receiptIds } = await pendingWork(trx, state.task_id);
      const { rows } = await sql<{ now: Date }>`SELECT now() AS now`.execute(trx);
      const unsigned: Checkpoint = {
        schema_version: CHECKPOINT_V2,
        checkpoint_id: randomUUID(),
        task_id: state.task_id,
        state_version: state.version,
        created_at: rows[0]!.now.toISOString(),
        created_by: input.createdBy,
        reason: input.reason,
        workflow_definition_digest: state.workflow_digest,
        input_digest:
          input.inputDigest ?? sha256(canonicalBytes({ intent_id: state.intent_id, task_id: state.task_id })),
        ...(input.outputDigest ? { output_digest: input.outputDigest } : {}),
        state_snapshot_uri: uri,
        pending_work: pending,
        tool_receipt_ids: receiptIds,
        budget_consumed: {
          currency_usd: state.budget.currency_spent_usd,
          tokens: state.budget.tokens_spent,
          hops: state.budget.hops_used,
        },
        provenance: {
          last_message_id: input.lastMessageId ?? null,
          delegation_hash: input.delegationHash ?? null,
          policy_version: input.policyVersion ?? null,
        },
        integrity: { snapshot_digest: sha256(bytes), previous_checkpoint_digest: prev?.digest ?? null },
      };
      const cp = CheckpointV2.parse(
        options.keyRing
          ? { ...unsigned, integrity: { ...unsigned.integrity, signature: sign(unsigned, options.keyRing) } }
          : unsigned,
      );
      await trx
        .insertInto('checkpoint')
        .values({
          checkpoint_id: cp.checkpoint_id,
          task_id: cp.task_id,
          seq: (prev?.seq ?? 0) + 1,
          state_version: cp.state_version,
          schema_version: CHECKPOINT_V2,
          reason: cp.reason,
          doc: JSON.stringify(cp),
          digest: sha256(signedBytes(cp)),
          data_class: dataClass,
        })
        .execute();
      hooks.afterInsert?.();
      return cp;
    },

    async list(taskId) {
      const rows = await db
        .selectFrom('checkpoint')
        .select(['doc', 'schema_version', 'seq', 'digest'])
        .where('task_id', '=', taskId)
        .orderBy('seq', 'desc')
        .execute();
      const out: StoredCheckpoint[] = [];
      for (const row of rows) {
        let budget: TaskState['budget'] | undefined;
        if (row.schema_version === CHECKPOINT_V1) {
          const bytes = await snapshotBytes(String(row.doc.state_snapshot_uri), taskId).catch(
            () => undefined,
          );
          if (bytes) budget = readSnapshot(bytes, taskId)?.budget;
        }
        out.push({
          checkpoint: parseDoc(row, budget),
          seq: row.seq,
          digest: row.digest,
          legacy: row.schema_version === CHECKPOINT_V1,
        });
      }
      return out;
    },

    async verify(stored, previous) {
      const cp = stored.checkpoint;
      const ring = options.keyRing;
      if (ring && !options.allowLegacyCheckpoints && (stored.legacy || !cp.integrity.signature)) {
        return invalid(
          `${stored.legacy ? 'legacy (v1) checkpoint' : 'checkpoint is not signed'} but a key ring is configured; refused (allowLegacyCheckpoints accepts rows written before signing)`,
        );
      }
      let bytes: Buffer | undefined;
      try {
        bytes = await snapshotBytes(cp.state_snapshot_uri, cp.task_id);
      } catch (err) {
        const unavailable = isOutage(err);
        return {
          ok: false,
          reason: unavailable ? 'unavailable' : 'invalid',
          message: `snapshot ${cp.state_snapshot_uri} cannot be read${unavailable ? ' now (an outage, not corruption)' : ''}: ${(err as Error).message}`,
        };
      }
      if (!bytes) return invalid(`snapshot ${cp.state_snapshot_uri} is missing`);
      const actual = sha256(bytes);
      if (actual !== cp.integrity.snapshot_digest) {
        return invalid(
          `snapshot digest mismatch: recorded ${cp.integrity.snapshot_digest}, computed ${actual}`,
        );
      }
      if (!stored.legacy) {
        const sig =
          cp.integrity.signature || !options.allowLegacyCheckpoints
            ? verifySignature(cp, ring)
            : { ok: true as const };
        if (!sig.ok && !sig.unknownKey) return invalid(sig.message);
        if (sha256(signedBytes(cp)) !== stored.digest)
          return invalid('checkpoint document does not match its recorded digest');
        if ((previous?.digest ?? null) !== cp.integrity.previous_checkpoint_digest) {
          return invalid(
            `broken chain: previous checkpoint digest is ${previous?.digest ?? 'none'}, the checkpoint names ${cp.integrity.previous_checkpoint_digest ?? 'none'}`,
          );
        }
        // Signed with a key this ring does not hold, everything that needs no key consistent:
        // an outage of configuration (invariant 13), never taken for forgery (resume would fall
        // back past every such checkpoint and fail the task). Resume stops; put the key back in
        // the ring. (A writer of the task's rows can make one on purpose: it stalls that task's
        // resume only, which its rows could do anyway; `cairn checkpoint verify` names the key.)
        if (!sig.ok)
          return {
            ok: false,
            reason: 'unavailable',
            message: `${sig.message}: the signature cannot be checked now (not corruption); add the key to the ring`,
          };
      }
      const state = readSnapshot(bytes, cp.task_id);
      if (!state) return invalid('snapshot is not a valid TaskState');
      if (state.version !== cp.state_version) {
        return invalid(`snapshot holds version ${state.version}, the checkpoint says ${cp.state_version}`);
      }
      return {
        ok: true,
        state,
        signatureChecked: ring !== undefined && !stored.legacy && !!cp.integrity.signature,
      };
    },
  };
}

/** Codes of errors that mean "a key or its provider is not there now", not "the data is wrong". */
const OUTAGE_CODES = new Set(['key_missing', 'key_unavailable', 'keyring_unreadable', 'unavailable']);

/**
 * An outage is never taken for corruption: an error of Cairn's that says the data is wrong
 * (authentication failed, another tenant's key) is corruption; one that says a key or a
 * dependency is missing, or any error from outside Cairn (a KMS call, the network), is not.
 */
export function isOutage(err: unknown): boolean {
  if (!(err instanceof CairnError)) return true;
  return err.retriable || OUTAGE_CODES.has(err.code);
}

function readSnapshot(bytes: Buffer, taskId: string): TaskState | undefined {
  try {
    const doc = JSON.parse(bytes.toString('utf8')) as Record<string, unknown>;
    return parseStoredTaskState({ task_id: taskId, tenant_id: String(doc.tenant_id ?? ''), doc });
  } catch {
    return undefined;
  }
}
