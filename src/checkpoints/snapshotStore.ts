import { randomUUID } from 'node:crypto';
import type { Db } from '../db/database.js';
import type { Executor, Trx } from '../db/executor.js';

/**
 * Where snapshot bytes live. Postgres by default (same transaction as the checkpoint row);
 * a file or object store can implement the same two calls.
 */
export interface SnapshotStore {
  put(trx: Trx, taskId: string, bytes: Buffer): Promise<string>;
  get(uri: string, db?: Executor): Promise<Buffer | undefined>;
}

const PREFIX = 'pg:checkpoint_snapshot/';

export function createPgSnapshotStore(db?: Db): SnapshotStore {
  return {
    async put(trx, taskId, bytes) {
      const id = randomUUID();
      await trx
        .insertInto('checkpoint_snapshot')
        .values({ snapshot_id: id, task_id: taskId, bytes })
        .execute();
      return `${PREFIX}${id}`;
    },
    async get(uri, ex) {
      if (!uri.startsWith(PREFIX)) return undefined;
      const on = ex ?? db;
      if (!on) throw new Error('createPgSnapshotStore needs a db to read');
      const row = await on
        .selectFrom('checkpoint_snapshot')
        .select('bytes')
        .where('snapshot_id', '=', uri.slice(PREFIX.length))
        .executeTakeFirst();
      return row?.bytes;
    },
  };
}
