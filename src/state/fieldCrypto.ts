import {
  type Classification,
  DEFAULT_CLASSIFICATION,
  type FieldClass,
  validateClassification,
} from '../checkpoints/classification.js';
import type { TenantKeys } from '../crypto/tenantKeys.js';
import type { Executor } from '../db/executor.js';
import { CairnError, ValidationError } from '../errors.js';
import type { OutboxMessageInput } from '../outbox/message.js';
import type { TaskState } from '../schemas/taskState.js';

/**
 * Classification of the live task document: what the store writes to task_state.doc (and
 * so to the audit patches, which are diffs of what it writes).
 *
 * - A `confidential` artifact is stored as an envelope, `cairn:enc:v1:<key id>:<base64url>`:
 *   AES-256-GCM under the tenant's data key, bound to the task and the field (AAD). The
 *   plaintext never reaches Postgres, so no table, WAL segment or backup holds it, and
 *   crypto-shredding the tenant's key makes it unreadable everywhere at once.
 * - A `secret` artifact is never stored: a write holding one is refused, naming the field.
 * - Copies count: a confidential or secret value found in a change's reason, or in the
 *   payload or headers of a message it causes, refuses the change (send a reference).
 *
 * Only artifacts are sealed: status, version, budget and the rest stay in the clear, so the
 * CAS, the SQL guards (transitions, terminal states, budget) and audit replay (which
 * rebuilds the stored document, envelopes included) work as before. An unchanged value
 * keeps its envelope, so the audit log shows no change where there was none.
 */
export const ENVELOPE_PREFIX = 'cairn:enc:v1:';
const ENVELOPE = /^cairn:enc:v1:([A-Za-z0-9_.-]{1,128}):([A-Za-z0-9_-]+)$/;

export function isEnvelope(value: unknown): value is string {
  return typeof value === 'string' && ENVELOPE.test(value);
}

type Artifacts = TaskState['artifacts'];
type ArtifactValue = Artifacts[keyof Artifacts];

export interface FieldCrypto {
  /** The document to store for `next` (plaintext); `prev` is the last stored and plaintext pair. */
  seal(ex: Executor, next: TaskState, prev?: { stored: TaskState; plain: TaskState }): Promise<TaskState>;
  /** The plaintext of a stored document. */
  open(ex: Executor, stored: TaskState): Promise<TaskState>;
  /** Refuses a confidential or secret value of `state` copied into `text` (names the field, never the value). */
  assertNotCopied(state: TaskState, where: string, text: string): void;
  /** The same for a change's reason and the payloads and headers of the messages it causes. */
  assertChangeNotCopied(
    state: TaskState,
    reason: string | undefined,
    messages: readonly OutboxMessageInput[] | undefined,
  ): void;
}

export function createFieldCrypto(o: { keys?: TenantKeys; classification?: Classification }): FieldCrypto {
  const classification = validateClassification(o.classification ?? DEFAULT_CLASSIFICATION);
  const classOf = (name: string): FieldClass =>
    classification[`artifacts.${name}`] ?? classification.artifacts ?? 'confidential';
  const aad = (taskId: string, name: string) => `artifact:${taskId}:${name}`;

  async function sealOne(ex: Executor, state: TaskState, name: string, value: string): Promise<string> {
    if (!o.keys) {
      throw new CairnError(
        'encryption_required',
        `task ${state.task_id}: artifacts.${name} is confidential and this task store has no tenant keys: ` +
          'refusing to store it in the clear (pass keys: createTenantKeys(...) to createTaskStore)',
      );
    }
    const sealed = await o.keys.seal(
      state.tenant_id,
      Buffer.from(value, 'utf8'),
      aad(state.task_id, name),
      ex,
    );
    return `${ENVELOPE_PREFIX}${sealed.keyId}:${sealed.bytes.toString('base64url')}`;
  }

  async function openOne(ex: Executor, state: TaskState, name: string, value: string): Promise<string> {
    const m = ENVELOPE.exec(value);
    if (!m) return value;
    if (!o.keys) {
      throw new CairnError(
        'key_missing',
        `task ${state.task_id}: artifacts.${name} is encrypted (key ${m[1]}) and this task store has no tenant keys`,
      );
    }
    const bytes = await o.keys.open(
      state.tenant_id,
      m[1]!,
      Buffer.from(m[2]!, 'base64url'),
      aad(state.task_id, name),
      ex,
    );
    return bytes.toString('utf8');
  }

  const each = async (value: ArtifactValue, f: (v: string) => Promise<string>): Promise<ArtifactValue> =>
    Array.isArray(value) ? Promise.all(value.map(f)) : value === undefined ? undefined : f(value);

  return {
    async seal(ex, next, prev) {
      const artifacts: Record<string, ArtifactValue> = {};
      const secret: string[] = [];
      for (const [name, value] of Object.entries(next.artifacts) as Array<[string, ArtifactValue]>) {
        const cls = classOf(name);
        if (cls === 'secret') {
          if (value !== undefined) secret.push(`artifacts.${name}`);
          continue;
        }
        if (cls !== 'confidential' || value === undefined) {
          artifacts[name] = value;
          continue;
        }
        const before = prev?.plain.artifacts[name as keyof Artifacts];
        const storedBefore = prev?.stored.artifacts[name as keyof Artifacts];
        artifacts[name] =
          storedBefore !== undefined && JSON.stringify(before) === JSON.stringify(value)
            ? storedBefore // unchanged: the same envelope, so the audit shows no change
            : await each(value, (v) => sealOne(ex, next, name, v));
      }
      if (secret.length > 0) {
        throw new ValidationError(
          `task ${next.task_id}`,
          secret.map((path) => ({
            path,
            message:
              'is classified secret and is never stored: keep it in a secret manager and store a reference',
          })),
        );
      }
      return { ...next, artifacts: artifacts as Artifacts };
    },

    async open(ex, stored) {
      const artifacts: Record<string, ArtifactValue> = {};
      for (const [name, value] of Object.entries(stored.artifacts) as Array<[string, ArtifactValue]>) {
        artifacts[name] = await each(value, (v) => openOne(ex, stored, name, v));
      }
      return { ...stored, artifacts: artifacts as Artifacts };
    },

    assertChangeNotCopied(state, reason, messages) {
      this.assertNotCopied(state, 'reason', reason ?? '');
      for (const [i, m] of (messages ?? []).entries()) {
        const payload = Buffer.isBuffer(m.payload) ? m.payload.toString('utf8') : JSON.stringify(m.payload);
        this.assertNotCopied(
          state,
          `outbox message [${i}]`,
          `${payload}\n${JSON.stringify(m.headers ?? {})}`,
        );
      }
    },

    assertNotCopied(state, where, text) {
      if (!text) return;
      const copied: string[] = [];
      for (const [name, value] of Object.entries(state.artifacts) as Array<[string, ArtifactValue]>) {
        const cls = classOf(name);
        if (cls !== 'confidential' && cls !== 'secret') continue;
        const values = Array.isArray(value) ? value : value === undefined ? [] : [value];
        // Short values would match by accident; pointers and documents are longer than this.
        if (values.some((v) => v.length >= 8 && !isEnvelope(v) && text.includes(v)))
          copied.push(`artifacts.${name}`);
      }
      if (copied.length > 0) {
        throw new ValidationError(
          `${where} of task ${state.task_id}`,
          copied.map((path) => ({
            path,
            message: `is ${classOf(path.slice('artifacts.'.length))} and its value is copied here: send a reference instead`,
          })),
        );
      }
    },
  };
}
