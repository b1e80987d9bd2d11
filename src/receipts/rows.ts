// A receipt's idempotency key and the columns a receipt row is read with.
import { canonicalBytes, sha256 } from '../canonical.js';
import { ValidationError } from '../errors.js';

/**
 * The idempotency key of (task, step, tool, args): a sha256 over their canonical JSON, the
 * same on every worker.
 */
export function idempotencyKeyOf(a: { taskId: string; step: string; tool: string; args: unknown }): string {
  try {
    return sha256(canonicalBytes({ task_id: a.taskId, step: a.step, tool: a.tool, args: a.args ?? null }));
  } catch {
    throw new ValidationError('receipt args', [{ path: 'args', message: 'must be JSON-serializable' }]);
  }
}

/** The columns a receipt is read with. */
export const COLUMNS = [
  'receipt_id',
  'idempotency_key',
  'task_id',
  'step',
  'tool',
  'status',
  'attempt',
  'worker',
  'result',
  'result_digest',
  'result_enc',
  'result_key_id',
  'tenant_id',
  'error',
  'resolution',
  'started_at',
  'finished_at',
] as const;
