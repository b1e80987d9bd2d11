import { sql } from 'kysely';
import type { Executor } from '../../src/db/executor.js';

/**
 * Deletes published rows, but only of lanes this instance still owns with the token it
 * claimed them under: a relay that lost a lane (paused, partitioned, slow) cannot delete
 * rows that the new owner is responsible for. Returns the ids it deleted.
 */
export async function deleteFenced(
  db: Executor,
  args: { instanceId: string; ids: readonly number[]; fences: ReadonlyMap<number, number> },
): Promise<number[]> {
  if (args.ids.length === 0) return [];
  const lanes = [...args.fences.keys()];
  const tokens = lanes.map((l) => args.fences.get(l)!);
  const { rows } = await sql<{ id: number }>`
    DELETE FROM outbox o
     USING relay_lane l
     WHERE o.id = ANY(${args.ids}::bigint[])
       AND l.lane = o.lane
       AND l.owner = ${args.instanceId}
       AND l.expires_at > now()
       AND (l.lane, l.fencing_token) IN (SELECT * FROM unnest(${lanes}::int[], ${tokens}::bigint[]))
    RETURNING o.id
  `.execute(db);
  return rows.map((r) => r.id);
}
