import { describe, expect, it } from 'vitest';
import { createDb } from '../../src/db/database.js';
import { replayChangelog } from '../../src/recovery/replayChangelog.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask, planApproved } from '../state/fixtures.js';
import { pausePoint } from '../support/pausePoint.js';
import { slowPool } from '../support/slowPool.js';
import { createTestTopic } from '../support/testDatabase.js';
import { clock, publishAll, useTwoRegions } from './twoRegions.js';

const regions = useTwoRegions('replay_conc');

describe('changelog replay run twice at once', () => {
  it('the slower run does not report (and hold) a task the other run rebuilt', async () => {
    const { a, b, reader } = regions;
    const topic = await createTestTopic('replay-concurrent', 1);
    const A = createTaskStore({ db: a.db, clock, changelog: { topic } });
    const B = createTaskStore({ db: b.db, clock, changelog: { topic } });
    for (const s of [A, B]) await s.create({ task: newTask('RC-1'), actor: AGENT });
    const r = await A.update({ taskId: 'RC-1', expectedVersion: 1, patch: planApproved(), actor: AGENT });
    expect(r.ok).toBe(true);
    await publishAll(a.db, "region A's outbox");

    // The second operator's run holds once it has read everything, as its transaction begins.
    const pause = pausePoint();
    let armed = true;
    const slowDb = createDb({
      pool: slowPool(b.url, (text) => {
        if (armed && text.trim().toLowerCase() === 'begin') {
          armed = false;
          return pause.hold();
        }
        return undefined;
      }),
      endPoolOnDestroy: true,
    });
    const opts = { topic, actor: 'spiffe://acme.example/operator', deadlineMs: 30_000 };
    const slow = replayChangelog(slowDb, reader, opts);
    await pause.reached;
    const fast = await replayChangelog(b.db, reader, opts);
    expect(fast.rebuilt.map((t) => t.taskId)).toEqual(['RC-1']);
    pause.release();
    const late = await slow;
    await slowDb.destroy();
    // Observed: incomplete [{ RC-1, reason: 'changed in this region since' }]: the CLI exits 1
    // and, with --hold, quarantines RC-1, which is exactly region A's task.
    expect(late.incomplete, 'a task the other run rebuilt is reported not rebuilt').toEqual([]);
  });
});
