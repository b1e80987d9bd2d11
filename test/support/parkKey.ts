import { sql } from 'kysely';
import { seedLanes } from '../../relay/sql/laneLeases.js';
import { parkKey } from '../../relay/sql/parkKey.js';
import type { Executor } from '../../src/db/executor.js';
import { laneOf } from '../../src/outbox/lanes.js';

/**
 * Parks a key as a relay holding its lane would (relay/sql/parkKey.ts parks only under the
 * lane's fencing token): takes the lane for a test relay first.
 */
export async function parkAsLaneOwner(
  db: Executor,
  p: Omit<Parameters<typeof parkKey>[1], 'lane'>,
): Promise<void> {
  await seedLanes(db);
  const lane = laneOf(p.key);
  const { rows } = await sql<{ token: number }>`
    UPDATE relay_lane SET owner = 'test-relay', fencing_token = fencing_token + 1, expires_at = now() + interval '1 minute'
     WHERE lane = ${lane} RETURNING fencing_token AS token`.execute(db);
  await parkKey(db, { ...p, lane: { lane, owner: 'test-relay', token: Number(rows[0]!.token) } });
}
