import { randomUUID } from 'node:crypto';
import type { Db } from '../db/database.js';
import type { Executor, Trx } from '../db/executor.js';
import { ValidationError } from '../errors.js';

/** Snapshot bytes as a SnapshotStore returns them, with the key and tenant they were sealed for. */
export interface StoredSnapshot {
  bytes: Buffer;
  /** The tenant data key that encrypted `bytes`, or null when they are in the clear. */
  keyId: string | null;
  tenantId: string | null;
}

/**
 * Where snapshot bytes live. Postgres by default (same transaction as the checkpoint row);
 * a file or object store can implement the same two calls.
 */
export interface SnapshotStore {
  /**
   * Stores the bytes (in `trx` when the store is transactional) and returns the URI the
   * checkpoint records.
   */
  put(trx: Trx, taskId: string, bytes: Buffer, meta?: { keyId?: string }): Promise<string>;
  /** The bytes behind a URI put() returned, or undefined when they are gone. */
  get(uri: string, db?: Executor): Promise<StoredSnapshot | undefined>;
}

const PREFIX = 'pg:checkpoint_snapshot/';

export function createPgSnapshotStore(db?: Db): SnapshotStore {
  return {
    async put(trx, taskId, bytes, meta) {
      const id = randomUUID();
      await trx
        .insertInto('checkpoint_snapshot')
        .values({ snapshot_id: id, task_id: taskId, bytes, key_id: meta?.keyId ?? null })
        .execute();
      return `${PREFIX}${id}`;
    },
    async get(uri, ex) {
      if (!uri.startsWith(PREFIX)) return undefined;
      const on = ex ?? db;
      if (!on) {
        throw new ValidationError('snapshot store', [
          {
            path: 'db',
            message: 'is required to read a snapshot: createPgSnapshotStore(db), or pass an executor',
          },
        ]);
      }
      const row = await on
        .selectFrom('checkpoint_snapshot')
        .select(['bytes', 'key_id', 'tenant_id'])
        .where('snapshot_id', '=', uri.slice(PREFIX.length))
        .executeTakeFirst();
      return row && { bytes: row.bytes, keyId: row.key_id, tenantId: row.tenant_id };
    },
  };
}
