import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Sink, startSink } from '../support/effectSink.js';
import { waitForLeasesExpired } from '../support/leases.js';
import { spawnTs } from '../support/processes.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const OPS = 360;
const KILLS = 200;
const SLOTS = 6;
const POINTS = ['after_intent', 'during_effect', 'after_effect'] as const;

let tdb: TestDatabase;
let sink: Sink;
beforeAll(async () => {
  tdb = await createTestDatabase('receipt_chaos', { max: 4 });
  sink = await startSink();
});
afterAll(async () => {
  await sink.close();
  await tdb.drop();
});

describe('receipts under worker death (real processes, effects counted by an HTTP sink)', () => {
  it('200 SIGKILLs at named points (after intent, during effect, after effect before succeeded): no operation ever reaches the sink under two keys, and every uncertain case ends compensated or gated', async () => {
    let kills = 0;
    let spawned = 0;
    const byPoint: Record<string, number> = {};
    let seed = 20261129;
    const rand = () => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return seed / 2 ** 31;
    };
    const slot = async (): Promise<void> => {
      while (kills < KILLS) {
        const point = POINTS[Math.floor(rand() * POINTS.length)]!;
        const child = spawnTs('worker', 'test/support/receiptWorker.ts', {
          DATABASE_URL: tdb.url,
          SINK_URL: sink.url,
          OPS: String(OPS),
          KILL_POINT: point,
          KILL_AT: String(1 + Math.floor(rand() * 3)),
          START: String(Math.floor(rand() * OPS)),
          WORKER: `w${spawned++}`,
        });
        await child.exited;
        if (child.proc.signalCode === 'SIGKILL') {
          kills++;
          byPoint[point] = (byPoint[point] ?? 0) + 1;
        } else if (child.proc.exitCode !== 0) {
          throw new Error(`worker failed:\n${child.output()}`);
        } else if (!child.output().includes('"unsettled":')) {
          throw new Error(`worker ended without its summary:\n${child.output()}`);
        } else {
          break; // nothing left that could kill it: every operation is settled
        }
      }
    };
    await Promise.all(Array.from({ length: SLOTS }, slot));

    // A last worker that never dies settles what is left, once the dead workers' leases expired.
    for (let round = 0; round < 10; round++) {
      await waitForLeasesExpired(tdb.db);
      const last = spawnTs('settler', 'test/support/receiptWorker.ts', {
        DATABASE_URL: tdb.url,
        SINK_URL: sink.url,
        OPS: String(OPS),
        KILL_POINT: 'none',
        WORKER: `settler-${round}`,
      });
      await last.exited;
      if (last.output().includes('"unsettled":0')) break;
    }

    const receipts = await tdb.db
      .selectFrom('tool_receipt')
      .select(['task_id', 'step', 'status', 'idempotency_key'])
      .execute();
    const main = receipts.filter((r) => r.step === 'deploy');
    const compensations = receipts.filter((r) => r.step === 'deploy/compensate');
    const statusCount = (rows: typeof receipts) => {
      const counts: Record<string, number> = {};
      for (const r of rows) counts[r.status] = (counts[r.status] ?? 0) + 1;
      return counts;
    };
    console.log(
      `receipt chaos: ${kills} kills ${JSON.stringify(byPoint)} over ${spawned} workers; deploy receipts ${JSON.stringify(statusCount(main))}; ` +
        `compensations ${JSON.stringify(statusCount(compensations))}; sink calls ${sink.calls}`,
    );
    expect(kills).toBeGreaterThanOrEqual(KILLS);
    expect(main).toHaveLength(OPS);
    // Every operation settled: done, undone, or waiting for a human. Nothing left started or uncertain.
    for (const r of [...main, ...compensations])
      expect(['succeeded', 'compensated', 'gated']).toContain(r.status);
    // No operation reached the sink under two idempotency keys: a retry never became a second effect.
    for (const [op, keys] of sink.keysByOperation) expect(keys.size, op).toBe(1);
    for (const r of main) {
      const keys = sink.keysByOperation.get(r.task_id);
      if (keys) expect([...keys]).toEqual([r.idempotency_key]);
      if (r.status === 'succeeded') expect(sink.applied.get(r.idempotency_key)).toBe(1);
      if (r.status === 'compensated') expect(sink.compensated.has(r.idempotency_key)).toBe(true);
    }
    // The uncertain cases really happened and were resolved, both ways.
    expect(main.filter((r) => r.status === 'compensated').length).toBeGreaterThan(0);
    expect(main.filter((r) => r.status === 'gated').length).toBeGreaterThan(0);
  });
});
