import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import type { ChangelogReceipt } from '../../src/state/changelog.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask, planApproved } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

/**
 * A changelog record carries the task's receipts that changed since its previous version:
 * region B restores them on a failover (a receipt started there is marked uncertain, never run
 * again blindly). A receipt taken back for another attempt after it failed kept the finished_at
 * of its failure, and the record's query read "changed since" from finished_at only: the new
 * attempt, running, was in no record, and region B, with the receipt failed, ran it again.
 */
let tdb: TestDatabase;
beforeAll(async () => {
  tdb = await createTestDatabase('changelog_receipts');
});
afterAll(async () => {
  await tdb?.drop();
});

const topic = 'cairn.changelog.receipts-test';

async function recordOf(taskId: string, version: number): Promise<ChangelogReceipt[]> {
  const row = await tdb.db
    .selectFrom('outbox')
    .select('payload')
    .where('topic', '=', topic)
    .where('task_id', '=', taskId)
    .where('task_version', '=', version)
    .executeTakeFirstOrThrow();
  return (JSON.parse(row.payload.toString()) as { body: { receipts: ChangelogReceipt[] } }).body.receipts;
}

/** Until the database's clock is past the task's receipts' finished_at (the next version is then after it). */
const pastFinishedAt = (taskId: string) =>
  waitFor('the clock past the receipts', async () => {
    const r = await sql<{ past: boolean }>`
      SELECT clock_timestamp() > max(finished_at) AS past FROM tool_receipt WHERE task_id = ${taskId}`.execute(
      tdb.db,
    );
    return r.rows[0]?.past === true;
  });

describe('the receipts a changelog record carries', () => {
  it('a receipt taken back after it failed, running its second attempt, is in the record of the change made meanwhile', async () => {
    const store = createTaskStore({ db: tdb.db, changelog: { topic } });
    await store.create({ task: newTask('CR-1'), actor: AGENT });
    const receipts = createReceiptStore({ db: tdb.db, worker: 'w1' });
    let attempt = 0;
    const deploy = () =>
      receipts.runOnce({
        taskId: 'CR-1',
        step: 'deploy',
        tool: 'deployer',
        args: { env: 'prod' },
        onUncertain: 'gate',
        effect: async () => {
          attempt++;
          if (attempt === 1) throw new Error('the deployer said no');
          // The second attempt runs: the task moves on meanwhile (another agent's change).
          await store.update({ taskId: 'CR-1', expectedVersion: 2, patch: planApproved(), actor: AGENT });
          return { deployed: true };
        },
      });
    expect((await deploy()).status).toBe('failed');
    await pastFinishedAt('CR-1'); // the failure strictly before version 2
    await store.update({
      taskId: 'CR-1',
      expectedVersion: 1,
      patch: { budget: { tokens_spent: 10 } },
      actor: AGENT,
    });
    expect((await recordOf('CR-1', 2)).map((r) => [r.status, r.attempt])).toEqual([['failed', 1]]);
    expect((await deploy()).status).toBe('succeeded');
    expect((await recordOf('CR-1', 3)).map((r) => [r.status, r.attempt])).toEqual([['started', 2]]);
  });

  it('a receipt left uncertain before the previous version, gated after it, is in the next record (gating sets no finished_at)', async () => {
    const store = createTaskStore({ db: tdb.db, changelog: { topic } });
    await store.create({ task: newTask('CR-2'), actor: AGENT });
    // The receipt store's own statements: the intent, the effect cut off (its lease lost: left
    // uncertain for the holder), then the holder's gate.
    await sql`INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, tenant_id, step, tool, args_digest, status, worker)
              VALUES (gen_random_uuid(), 'CR-2/deploy', 'CR-2', 'acme', 'deploy', 'deployer', 'sha256:aa', 'started', 'w1')`.execute(
      tdb.db,
    );
    await sql`UPDATE tool_receipt SET status = 'uncertain', error = 'socket hang up', finished_at = now()
               WHERE task_id = 'CR-2'`.execute(tdb.db);
    await pastFinishedAt('CR-2');
    await store.update({ taskId: 'CR-2', expectedVersion: 1, patch: planApproved(), actor: AGENT });
    // A human's gate, as the receipt store sets it (status and resolution only).
    await sql`UPDATE tool_receipt SET status = 'gated', resolution = 'waiting for a human decision'
               WHERE task_id = 'CR-2'`.execute(tdb.db);
    await store.update({
      taskId: 'CR-2',
      expectedVersion: 2,
      patch: { budget: { tokens_spent: 10 } },
      actor: AGENT,
    });
    expect((await recordOf('CR-2', 3)).map((x) => x.status)).toEqual(['gated']);
  });
});
