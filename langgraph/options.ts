import type { RunnableConfig } from '@langchain/core/runnables';
import type { Checkpoint, CheckpointMetadata, SerializerProtocol } from '@langchain/langgraph-checkpoint';
import { z } from 'zod';
import { KeyRingSchema } from '../src/checkpoints/options.js';
import type { KeyRing } from '../src/checkpoints/signing.js';
import type { TenantKeys } from '../src/crypto/tenantKeys.js';
import type { Db } from '../src/db/database.js';
import { ValidationError } from '../src/errors.js';
import { objectWith, opt, optionsSchema } from '../src/options.js';
import type { ThreadScope } from './integrity.js';

/** Decides whether a checkpoint is a semantic boundary (kept by compaction). */
export type BoundaryRule = (metadata: CheckpointMetadata, checkpoint: Checkpoint) => boolean;

/**
 * The default boundaries: where a run takes input (`source: 'input'`) and where a human or a
 * tool changed the state from outside (`update`, `fork`). The steps between are LangGraph's
 * per-superstep records, which compaction may remove once a later boundary exists.
 */
export const DEFAULT_BOUNDARY: BoundaryRule = (metadata) =>
  metadata.source === 'input' || metadata.source === 'update' || metadata.source === 'fork';

/** What createCairnSaver takes. */
export interface CairnSaverOptions {
  /**
   * The database, from createDb, or forTenant(db, tenant) to keep the tenant's threads apart
   * from every other tenant's (row-level security on the tenant's login role).
   */
  db: Db;
  /**
   * `refuse` (default): a put whose parent is not the thread's newest checkpoint is refused
   * with `checkpoint_conflict`, so two writers cannot fork a thread silently; the graph's
   * invoke rejects with that error. `allow`: LangGraph's own behaviour, for time travel
   * (resuming from an older checkpoint_id) and `durability: 'exit'`.
   */
  forks?: 'refuse' | 'allow';
  /** Signs every row (HMAC-SHA256); rows that are unsigned or signed by another key then do not verify. */
  keyRing?: KeyRing;
  /** Encrypts channel values and pending writes with the tenant's data key (needs a forTenant db). */
  keys?: TenantKeys;
  /** Which checkpoints are semantic boundaries ({@link DEFAULT_BOUNDARY}). */
  boundary?: BoundaryRule;
  /** LangGraph's serializer (default: its JsonPlusSerializer). */
  serde?: SerializerProtocol;
}

export const CairnSaverOptionsSchema = optionsSchema<CairnSaverOptions>()(
  z.strictObject({
    db: opt.db(),
    forks: z.enum(['refuse', 'allow']).optional(),
    keyRing: KeyRingSchema.optional(),
    keys: objectWith<TenantKeys>('TenantKeys (createTenantKeys())', 'seal', 'open').optional(),
    boundary: opt.fn<BoundaryRule>('a function (metadata, checkpoint) => boolean').optional(),
    serde: objectWith<SerializerProtocol>('a LangGraph serializer', 'dumpsTyped', 'loadsTyped').optional(),
  }),
);

/** The `configurable` fields the saver reads, checked by name. */
export function scopeOf(config: RunnableConfig, what: string, tenant: string): ThreadScope & { id?: string } {
  const c = config.configurable;
  if (c === undefined || c === null || typeof c !== 'object') {
    throw new ValidationError(what, [{ path: 'configurable', message: 'is required', value: c }]);
  }
  const thread = c.thread_id;
  if (typeof thread !== 'string' || thread === '') {
    throw new ValidationError(what, [
      {
        path: 'configurable.thread_id',
        message: 'must be a non-empty string: graph.invoke(input, { configurable: { thread_id } })',
        value: thread,
      },
    ]);
  }
  const ns = c.checkpoint_ns ?? '';
  if (typeof ns !== 'string') {
    throw new ValidationError(what, [
      { path: 'configurable.checkpoint_ns', message: 'must be a string', value: ns },
    ]);
  }
  const id = c.checkpoint_id;
  if (id !== undefined && id !== null && (typeof id !== 'string' || id === '')) {
    throw new ValidationError(what, [
      { path: 'configurable.checkpoint_id', message: 'must be a non-empty string', value: id },
    ]);
  }
  return { tenant, thread, ns, ...(id ? { id } : {}) };
}

export const configOf = (s: ThreadScope, id: string): RunnableConfig => ({
  configurable: { thread_id: s.thread, checkpoint_ns: s.ns, checkpoint_id: id },
});

/** A thread id argument (deleteThread, compact, events), checked by name. */
export const requireThreadId = (what: string, threadId: unknown): string => {
  if (typeof threadId !== 'string' || threadId === '') {
    throw new ValidationError(what, [
      { path: 'threadId', message: 'must be a non-empty string', value: threadId },
    ]);
  }
  return threadId;
};

/** The checkpoint a call names (putWrites, markBoundary): its `configurable.checkpoint_id`, required. */
export function requireCheckpointId(s: { id?: string }, what: string): string {
  if (!s.id) {
    throw new ValidationError(what, [
      { path: 'configurable.checkpoint_id', message: 'is required: name the checkpoint', value: s.id },
    ]);
  }
  return s.id;
}
