import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';
import type { ThreadScope } from '../integrity.js';

/** Pending writes of one task; special channels (errors, interrupts) replace what was there. */
export function insertWrites(
  ex: Executor,
  s: ThreadScope,
  checkpointId: string,
  w: {
    taskId: string;
    taskPath: string;
    idx: number[];
    channel: string[];
    type: string[];
    blob: Buffer[];
    key: Array<string | null>;
    digest: string[];
    sigKey: Array<string | null>;
    sig: Array<string | null>;
  },
  upsert: boolean,
) {
  const onConflict = upsert
    ? sql`ON CONFLICT (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
          task_path = EXCLUDED.task_path, channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob,
          key_id = EXCLUDED.key_id, digest = EXCLUDED.digest, sig_key = EXCLUDED.sig_key, sig = EXCLUDED.sig`
    : sql`ON CONFLICT DO NOTHING`;
  return sql`
    INSERT INTO lg_write (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob,
                          key_id, digest, sig_key, sig)
    SELECT ${s.tenant}, ${s.thread}, ${s.ns}, ${checkpointId}, ${w.taskId}, ${w.taskPath}, u.* FROM unnest(
      ${w.idx}::int[], ${w.channel}::text[], ${w.type}::text[], ${w.blob}::bytea[], ${w.key}::text[],
      ${w.digest}::text[], ${w.sigKey}::text[], ${w.sig}::text[]) AS u
    ${onConflict}
  `.execute(ex);
}

/** The pending sends (TASKS writes) of parent checkpoints, for checkpoints older than format 4. */
export interface WriteRow {
  checkpoint_id: string;
  task_id: string;
  idx: number;
  task_path: string;
  channel: string;
  type: string;
  blob: Buffer;
  key_id: string | null;
  digest: string;
  sig_key: string | null;
  sig: string | null;
}

export function selectPendingSends(s: ThreadScope, channel: string, parents: string[]) {
  return sql<WriteRow>`
    SELECT checkpoint_id, task_id, idx, task_path, channel, type, blob, key_id, digest, sig_key, sig FROM lg_write
     WHERE tenant_id = ${s.tenant} AND thread_id = ${s.thread} AND checkpoint_ns = ${s.ns}
       AND checkpoint_id = ANY(${parents}::text[]) AND channel = ${channel}
     ORDER BY checkpoint_id, task_path COLLATE "C", task_id COLLATE "C", idx
  `;
}
