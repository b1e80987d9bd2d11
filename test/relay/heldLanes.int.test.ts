/**
 * The lanes a relay holds (relay/heldLanes.ts), against a database whose answers come late
 * (review of 8439f79):
 * - a renewal whose answer came late was timed from the answer: the relay then trusted its
 *   leases for a third of the TTL past their end (a full run of it sent a lost lane's message
 *   again after the lane's new owner had sent on);
 * - a delete's renew() ran beside the loop's rebalance, and the one answered last won: a lane
 *   the rebalance released came back under its old token.
 */
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHeldLanes } from '../../relay/heldLanes.js';
import { newRelayStats } from '../../relay/types.js';
import { createDb, type Db } from '../../src/db/database.js';
import { silentLogger } from '../../src/logger.js';
import { pausePoint } from '../support/pausePoint.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

const RENEW = 'UPDATE relay_lane SET expires_at = now()';
let tdb: TestDatabase;
let db: Db;
/** Renewal queries sent so far; while `held` is set, the next renewal's answer waits for it. */
let renewals = 0;
let held: ReturnType<typeof pausePoint> | undefined;

beforeAll(async () => {
  tdb = await createTestDatabase('held_lanes');
  // A client whose renewal answers can be held after the UPDATE has committed.
  class LateClient extends pg.Client {
    // biome-ignore lint/suspicious/noExplicitAny: pg's query overloads
    override query(...args: any[]): any {
      const text: string | undefined = typeof args[0] === 'string' ? args[0] : args[0]?.text;
      // biome-ignore lint/suspicious/noExplicitAny: pg's query overloads
      const answer = (super.query as any)(...args);
      if (!text?.includes(RENEW)) return answer;
      renewals++;
      const hold = held;
      held = undefined;
      return hold
        ? answer.then(async (r: unknown) => {
            await hold.hold();
            return r;
          })
        : answer;
    }
  }
  const pool = new pg.Pool({ connectionString: tdb.url, Client: LateClient, max: 4 });
  pool.on('error', () => {});
  db = createDb({ pool, endPoolOnDestroy: true });
  await sql`INSERT INTO relay_lane (lane) SELECT g FROM generate_series(0, 31) g ON CONFLICT DO NOTHING`.execute(
    db,
  );
});
afterAll(async () => {
  await db?.destroy();
  await tdb?.drop();
});

const leaseLeftMs = async (lane: number) =>
  Number(
    (
      await sql<{
        ms: number;
      }>`SELECT extract(epoch FROM expires_at - now()) * 1000 AS ms FROM relay_lane WHERE lane = ${lane}`.execute(
        tdb.db,
      )
    ).rows[0]!.ms,
  );

/** A relay's lanes, its leases 6 s long and renewed every 2 s. */
const heldBy = (instanceId: string) =>
  createHeldLanes({
    db,
    instanceId,
    ttlMs: 6000,
    renewEveryMs: 2000,
    log: silentLogger,
    stats: newRelayStats(),
  });

describe('the lanes a relay holds', () => {
  it('a renewal answered late is timed from the query: once its lease has run out, the next keep() finds the lanes lost', async () => {
    const lanes = heldBy('late');
    await lanes.rebalance();
    const lane = [...lanes.owned.keys()][0]!;
    await new Promise((r) => setTimeout(r, 2100)); // a renewal is due by the relay's own clock
    held = pausePoint();
    const hold = held;
    const keeping = lanes.keep(); // the UPDATE commits, its answer waits
    await hold.reached;
    await waitFor('the lease to be nearly over', async () => (await leaseLeftMs(lane)) < 500, 10_000);
    hold.release();
    await keeping;
    await waitFor('the lease to run out', async () => (await leaseLeftMs(lane)) <= 0, 5_000);
    await lanes.keep();
    // Observed before: the lanes still held (the renewal timed from its answer, 0.5 s before).
    expect(lanes.owned.has(lane)).toBe(false);
    await sql`UPDATE relay_lane SET owner = NULL, expires_at = '-infinity'`.execute(tdb.db);
    await sql`DELETE FROM relay_instance`.execute(tdb.db);
  });

  it("one query at a time: a delete's renew() waits for the rebalance in flight", async () => {
    const lanes = heldBy('serial');
    const before = renewals;
    held = pausePoint();
    const hold = held;
    const rebalancing = lanes.rebalance(); // its renewal answered late
    await hold.reached;
    const renewing = lanes.renew();
    await new Promise((r) => setTimeout(r, 300));
    const sentMeanwhile = renewals - before;
    hold.release();
    // Observed before: the renew's UPDATE ran at once, beside the rebalance (2).
    expect(sentMeanwhile).toBe(1);
    await rebalancing;
    await renewing;
    expect(renewals - before).toBe(2);
    const { rows } = await sql<{ lane: number; token: string }>`
      SELECT lane, fencing_token::text AS token FROM relay_lane WHERE owner = 'serial' AND expires_at > now()`.execute(
      tdb.db,
    );
    expect(new Map([...lanes.owned].map(([l, t]) => [l, String(t)]))).toEqual(
      new Map(rows.map((r) => [r.lane, r.token])),
    );
  });
});
