import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { expect, it } from 'vitest';
import { heldTasksTouched } from '../../scripts/failover/evidence.js';
import type { Db } from '../../src/db/database.js';
import { checkAfterFailover, quarantine } from '../../src/recovery/failover.js';
import { replayChangelog } from '../../src/recovery/replayChangelog.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask, planApproved } from '../state/fixtures.js';
import { createTestTopic } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { clock, publishAll, useTwoRegions } from './twoRegions.js';

/**
 * The failover harness once failed "held tasks untouched in region B: 1 changed": a task the
 * changelog replay rebuilt in part (up to the last record the broker/mirror has) and that the
 * check then still finds diverged (a later message of it is on the broker, its record is not)
 * is held; the replay's own audit rows were written after the promotion, before the hold, and the
 * harness counted them as a change of a held task. Nothing touched it after the hold, which is
 * what the harness checks now (scripts/failover/evidence.ts heldTasksTouched).
 */
const regions = useTwoRegions('held_touched');
const ring = { current: 'k1', keys: { k1: randomBytes(32) } };

/** The harness's old check: anything written since the promotion. */
const touchedSince = async (db: Db, since: Date, held: string[]) =>
  (
    await sql<{ task_id: string }>`
      SELECT DISTINCT task_id FROM (
        SELECT task_id FROM task_audit WHERE at > ${since}
        UNION ALL SELECT task_id FROM tool_receipt WHERE started_at > ${since}) x
       WHERE task_id = ANY(${held}::text[])`.execute(db)
  ).rows.map((r) => r.task_id);

it('a task rebuilt in part by the replay, then held by the check, is untouched since its hold (the replay wrote before it); a change after the hold is counted', async () => {
  const { a, b, reader } = regions;
  const topic = await createTestTopic('held-touched-changelog', 1);
  const stage = await createTestTopic('held-touched-stage', 1);
  const store = (db: Db) => createTaskStore({ db, clock, changelog: { topic, keyRing: ring } });
  const [A, B] = [store(a.db), store(b.db)];
  // Both regions up to the cut (B is A's replica): the task at version 1.
  for (const s of [A, B]) await s.create({ task: newTask('HT-1'), actor: AGENT });
  await sql`DELETE FROM outbox`.execute(b.db);
  // Region A alone: v2 and v3, each with a stage message and a changelog record.
  expect(
    (
      await A.update({
        taskId: 'HT-1',
        expectedVersion: 1,
        patch: planApproved(),
        actor: AGENT,
        messages: [{ topic: stage, payload: { n: 2 } }],
      })
    ).ok,
  ).toBe(true);
  expect(
    (
      await A.update({
        taskId: 'HT-1',
        expectedVersion: 2,
        patch: { gates: { implementation_complete: true } },
        actor: AGENT,
        messages: [{ topic: stage, payload: { n: 3 } }],
      })
    ).ok,
  ).toBe(true);
  // v3's stage message reaches the broker (or the mirror), its changelog record does not (killed
  // between the two, or the mirror paused between the two topics' partitions).
  await sql`DELETE FROM outbox WHERE task_id = 'HT-1' AND task_version = 3 AND topic = ${topic}`.execute(
    a.db,
  );
  await publishAll(a.db);

  // Region B's clock (the rows' timestamps are its), past the promotion before the replay writes.
  const dbNow = async () => (await sql<{ t: Date }>`SELECT clock_timestamp() AS t`.execute(b.db)).rows[0]!.t;
  const promotedAt = await dbNow();
  await waitFor('region B clock to pass the promotion', async () => (await dbNow()) > promotedAt);
  const replay = await replayChangelog(b.db, reader, {
    topic,
    keyRing: ring,
    actor: 'op',
    deadlineMs: 30_000,
  });
  expect(replay.rebuilt).toEqual([{ taskId: 'HT-1', tenantId: 'acme', from: 1, to: 2 }]);
  expect(replay.incomplete).toEqual([]);
  const report = await checkAfterFailover(b.db, reader, { topics: [stage, topic] });
  expect(report.lostTransitions.map((l) => [l.taskId, l.storedVersion, l.seenVersion])).toEqual([
    ['HT-1', 2, 3],
  ]);
  expect(report.divergedTasks).toEqual(['HT-1']);
  const replayedAt = await dbNow();
  await waitFor('region B clock to pass the replay', async () => (await dbNow()) > replayedAt);
  await quarantine(b.db, report.divergedTasks, { reason: 'failover: lost work', actor: 'op' });

  // Nothing writes to the task after the hold ...
  expect(await heldTasksTouched(b.db, report.divergedTasks)).toEqual([]);
  // ... but the harness's check (since promotion) counts the replay's audit row of v2.
  expect(await touchedSince(b.db, promotedAt, report.divergedTasks)).toEqual(['HT-1']);
  const rows = await b.db
    .selectFrom('task_audit')
    .select(['version', 'reason'])
    .where('task_id', '=', 'HT-1')
    .where('at', '>', promotedAt)
    .execute();
  expect(rows).toEqual([{ version: 2, reason: expect.stringMatching(/^replayed from changelog /) }]);

  // What the harness's check is for: a change after the hold is counted (written here past the
  // guards' triggers, as only a superuser could).
  await b.db.transaction().execute(async (trx) => {
    await sql`SET LOCAL session_replication_role = replica`.execute(trx);
    await sql`INSERT INTO task_audit (task_id, version, prev_version, tenant_id, actor, reason, patch)
              VALUES ('HT-1', 3, 2, 'acme', 'intruder', 'after the hold', '{}'::jsonb)`.execute(trx);
  });
  expect(await heldTasksTouched(b.db, report.divergedTasks)).toEqual(['HT-1']);
});
