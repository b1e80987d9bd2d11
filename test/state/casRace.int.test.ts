import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { replayAudit } from '../../src/state/replay.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { AGENT, newTask } from './fixtures.js';

const WRITERS = 50;
const UPDATES = 1000;

let tdb: TestDatabase;
beforeAll(async () => {
  tdb = await createTestDatabase('cas_race', { max: WRITERS });
});
afterAll(async () => {
  await tdb.drop();
});

describe('CAS under contention', () => {
  it('50 writers racing for 1,000 updates: versions contiguous, no lost update, every loser got StaleWriteError, one audit row per version', async () => {
    const store = createTaskStore({ db: tdb.db });
    await store.create({ task: newTask('race'), actor: AGENT });

    let successes = 0;
    let stale = 0;
    const unexpected: unknown[] = [];
    const won: Array<{ writer: number; version: number }> = [];

    const writer = async (w: number) => {
      while (successes < UPDATES) {
        const current = await store.get('race');
        const r = await store
          .update({
            taskId: 'race',
            expectedVersion: current!.version,
            // Each success adds one token and names the last writer: a lost update would show
            // as tokens_spent below the number of committed updates.
            patch: { budget: { tokens_spent: current!.budget.tokens_spent + 1 }, active_agents: [`w${w}`] },
            actor: `spiffe://acme.example/writers/${w}`,
          })
          .catch((e: unknown) => {
            unexpected.push(e);
            return undefined;
          });
        if (!r) return;
        if (r.ok) {
          if (successes >= UPDATES) break;
          successes++;
          won.push({ writer: w, version: r.state.version });
        } else {
          expect(r.error.name).toBe('StaleWriteError');
          expect(r.currentVersion).toBeGreaterThan(r.expectedVersion);
          stale++;
        }
      }
    };
    await Promise.all(Array.from({ length: WRITERS }, (_, w) => writer(w)));

    expect(unexpected.map((e) => String(e))).toEqual([]);
    const final = await store.get('race');
    const history = await store.history('race');
    // Writers may overshoot by at most one in-flight success each; count what committed.
    const committed = final!.version - 1;
    expect(committed).toBeGreaterThanOrEqual(UPDATES);
    expect(history.map((h) => h.version)).toEqual(Array.from({ length: final!.version }, (_, i) => i + 1));
    // No lost update: every committed change is in the list, in version order.
    expect(final!.budget.tokens_spent).toBe(committed);
    // Every success a writer saw is a distinct version: no two writers won the same CAS.
    expect(new Set(won.map((x) => x.version)).size).toBe(won.length);
    expect(replayAudit(history)).toEqual(final);
    expect(stale).toBeGreaterThan(0);
    console.log(`cas race: ${committed} committed, ${stale} stale rejections across ${WRITERS} writers`);
  });
});
