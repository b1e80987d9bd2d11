import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';
import type { Claim, ClaimedRow } from './claimBatch.js';
import { intArray } from './intArray.js';

/**
 * The WAL mode's sweep of held keys: the rows of these keys (tenant '' for none, topic, key)
 * in the lanes this relay owns, oldest first, skipping parked keys and rows in flight. Through
 * the (tenant_id, key) index: a key's rows, not a lane's.
 */
export async function claimKeys(
  db: Executor,
  args: {
    lanes: readonly number[];
    keys: ReadonlyArray<{ tenant: string; topic: string; key: string }>;
    limit: number;
    /** Payload bytes per claim, as claimBatch's (the first row always). */
    maxBytes?: number;
    exclude?: ReadonlyArray<{ id: number; lane: number }>;
  },
): Promise<Claim> {
  if (args.lanes.length === 0 || args.keys.length === 0) return { rows: [], full: false };
  const { rows } = await sql<ClaimedRow>`
    SELECT o.id, o.lane, o.message_id, o.tenant_id, o.task_id, o.task_version, o.task_seq,
           o.topic, o.key, o.headers, o.payload,
           (extract(epoch FROM o.created_at) * 1000)::float8 AS created_ms
      FROM unnest(${args.keys.map((k) => k.tenant)}::text[], ${args.keys.map((k) => k.topic)}::text[],
                  ${args.keys.map((k) => k.key)}::text[]) AS h(tenant, topic, key)
     CROSS JOIN LATERAL (
       -- Two branches so each probes the (tenant_id, key) index (a NULL tenant is ''):
       SELECT * FROM outbox x WHERE h.tenant <> '' AND x.tenant_id = h.tenant AND x.key = h.key AND x.topic = h.topic
       UNION ALL
       SELECT * FROM outbox x WHERE h.tenant = '' AND x.tenant_id IS NULL AND x.key = h.key AND x.topic = h.topic) o
     WHERE o.lane = ANY(${intArray(args.lanes)}::int[])
       AND o.id <> ALL(${intArray((args.exclude ?? []).map((r) => r.id))}::bigint[])
       AND NOT EXISTS (SELECT 1 FROM outbox_parked_key p
                        WHERE p.tenant = h.tenant AND p.topic = h.topic AND p.key = h.key)
     ORDER BY o.id
     LIMIT ${args.limit + 1}
  `.execute(db);
  let full = rows.length > args.limit;
  const kept: ClaimedRow[] = [];
  let bytes = 0;
  for (const r of rows.slice(0, args.limit)) {
    const size = r.payload.length + JSON.stringify(r.headers ?? null).length + (r.key?.length ?? 0);
    if (kept.length > 0 && bytes + size > (args.maxBytes ?? Number.MAX_SAFE_INTEGER)) {
      full = true;
      break;
    }
    bytes += size;
    kept.push(r);
  }
  return { rows: kept, full };
}
