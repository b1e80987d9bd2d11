import { sql } from 'kysely';
import type { Db } from '../src/db/database.js';
import type { RowCodec } from './rowCodec.js';
import { type CheckpointRow, selectCheckpoints } from './sql/selectCheckpoints.js';
import { compactCheckpoints, deleteUnreferencedBlobs, lockThreadRows } from './sql/threadMaintenance.js';

/**
 * Removes the per-step checkpoints of a thread that lie before its newest boundary (see
 * CairnSaver.compact). Under the thread's lock, each namespace's history is walked from its
 * newest checkpoint that verifies through parents that verify, so a corrupt or forged row
 * (a boundary flag is outside the digest) never decides what goes, and other branches stay.
 */
export async function compactThread(
  db: Db,
  codec: RowCodec,
  tenant: string,
  threadId: string,
): Promise<{ removed: number }> {
  return db.transaction().execute(async (trx) => {
    await lockThreadRows(trx, tenant, threadId);
    const { rows } = await selectCheckpoints(
      sql`cp.tenant_id = ${tenant} AND cp.thread_id = ${threadId}`,
      sql`ORDER BY cp.checkpoint_ns, cp.checkpoint_id DESC`,
    ).execute(trx);
    const victims = { ns: [] as string[], id: [] as string[] };
    for (const ns of new Set(rows.map((r) => r.checkpoint_ns))) {
      const verified = new Map<string, CheckpointRow>();
      const newestFirst = rows.filter((r) => r.checkpoint_ns === ns);
      for (const r of newestFirst) if ((await codec.verify(r)).ok) verified.set(r.checkpoint_id, r);
      const chain: CheckpointRow[] = [];
      let at = newestFirst.find((r) => verified.has(r.checkpoint_id));
      while (at) {
        chain.push(at);
        at = at.parent_checkpoint_id === null ? undefined : verified.get(at.parent_checkpoint_id);
      }
      const newestBoundary = chain.findIndex((r) => r.boundary);
      if (newestBoundary < 0) continue;
      for (const r of chain.slice(newestBoundary + 1)) {
        if (r.boundary) continue;
        victims.ns.push(ns);
        victims.id.push(r.checkpoint_id);
      }
    }
    if (victims.id.length === 0) return { removed: 0 };
    const { rows: done } = await compactCheckpoints(trx, tenant, threadId, victims);
    await deleteUnreferencedBlobs(trx, tenant, threadId);
    return { removed: Number(done[0]?.removed ?? 0) };
  });
}
