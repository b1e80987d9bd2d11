/**
 * `cairn failover replay --hold` run twice at once (two operators on the promoted database,
 * or a rerun while the first is still reading the topic). Run twice in a row, the second
 * finds everything up to date (changelog.int); at once, the slower run read the task before
 * the faster one rebuilt it, its CAS then fails, and it reports the task "changed in this
 * region since", not rebuilt (exit 1), so --hold quarantines a task the other run restored.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRelay } from '../../relay/relay.js';
import { createDb } from '../../src/db/database.js';
import { createKafkaAdmin } from '../../src/kafka/admin.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { replayChangelog } from '../../src/recovery/replayChangelog.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask, planApproved } from '../state/fixtures.js';
import { pausePoint } from '../support/pausePoint.js';
import { slowPool } from '../support/slowPool.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

let a: TestDatabase;
let b: TestDatabase;
const reader = createKafkaAdmin({ brokers: kafkaBrokers(), clientId: 'replay-concurrent-reader' });
const clock = () => new Date('2026-12-01T00:00:00.000Z');

beforeAll(async () => {
  [a, b] = await Promise.all([createTestDatabase('replay_conc_a'), createTestDatabase('replay_conc_b')]);
});
afterAll(async () => {
  await reader.close();
  await a?.drop();
  await b?.drop();
});

describe('changelog replay run twice at once', () => {
  it('the slower run does not report (and hold) a task the other run rebuilt', async () => {
    const topic = await createTestTopic('replay-concurrent', 1);
    const A = createTaskStore({ db: a.db, clock, changelog: { topic } });
    const B = createTaskStore({ db: b.db, clock, changelog: { topic } });
    for (const s of [A, B]) await s.create({ task: newTask('RC-1'), actor: AGENT });
    const r = await A.update({ taskId: 'RC-1', expectedVersion: 1, patch: planApproved(), actor: AGENT });
    expect(r.ok).toBe(true);
    const relay = createRelay({ db: a.db, publisher: createKafkaPublisher({ brokers: kafkaBrokers() }) });
    const running = relay.run();
    await waitFor(
      "region A's outbox to be published",
      async () =>
        (await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox`.execute(a.db)).rows[0]!.n === 0,
    );
    await relay.stop();
    await running;

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
