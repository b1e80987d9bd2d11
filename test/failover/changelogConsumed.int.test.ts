import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import type { Db } from '../../src/db/database.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { consumptionMark, stateDigest } from '../../src/state/changelog.js';
import { AGENT, newTask, planApproved } from '../state/fixtures.js';
import { cairnBundle } from '../support/cli.js';
import { kafkaBrokers } from '../support/testDatabase.js';
import { changelogHarness } from './changelogHarness.js';
import { runRegionAAgent } from './regionAgent.js';

/**
 * Issue 20. Region A and region B are two databases: both run the same changes up to the cut
 * (same clock, so the same documents: B is A's replica), then A goes on alone and its relay
 * publishes, changelog included. B then replays what it lost from the topic.
 */
const { dbs, kafka, regions, both, publishA, replay, docOf, produce } =
  changelogHarness('changelog_consumed');

describe('changelog replay after an asynchronous failover: consumptions, refusals, limits', () => {
  it('restores the inbox row and the receipt a lost transition names; `cairn failover replay --hold` holds the rest', async () => {
    const { topic, stage, A, B } = await regions();
    for (const id of ['RC-1', 'RC-GAP'])
      await both([A, B], (s) => s.create({ task: newTask(id), actor: AGENT }));
    // Region A alone: the deploy runs once (its receipt), then an agent consuming a stage
    // message moves the task on in its inbox transaction.
    let ran = 0;
    const deploy = (db: Db, worker: string) =>
      createReceiptStore({ db, worker }).runOnce({
        taskId: 'RC-1',
        step: 'deploy',
        tool: 'deployer',
        args: { env: 'prod' },
        onUncertain: 'gate',
        effect: async () => {
          ran++;
          return { deployed: true };
        },
      });
    const r = await deploy(dbs.a.db, 'tester-a');
    expect(r.status).toBe('succeeded');
    const producer = kafka.producer();
    await producer.connect();
    await producer.send({
      topic: stage,
      messages: [
        { key: 'RC-1', value: '{}', headers: { 'cairn-message-id': 'go-RC-1', 'cairn-tenant': 'acme' } },
      ],
    });
    await producer.disconnect();
    const group = await runRegionAAgent({ db: dbs.a.db, store: A, topic: stage, applied: 1 });
    await A.update({ taskId: 'RC-GAP', expectedVersion: 1, patch: planApproved(), actor: AGENT });
    await A.update({
      taskId: 'RC-GAP',
      expectedVersion: 2,
      patch: { gates: { implementation_complete: true } },
      actor: AGENT,
    });
    await sql`DELETE FROM outbox WHERE task_id = 'RC-GAP' AND task_version = 2 AND topic = ${topic}`.execute(
      dbs.a.db,
    );
    await publishA();

    const cli = (...args: string[]) =>
      promisify(execFile)(process.execPath, [cairnBundle(), 'failover', 'replay', ...args], {
        cwd: repoRoot,
        env: { ...process.env, KAFKA_BROKERS: kafkaBrokers().join(','), DATABASE_URL: dbs.b.url },
      }).then(
        (o) => ({ code: 0, stdout: o.stdout }),
        (e: { code: number; stdout: string }) => ({ code: e.code, stdout: e.stdout }),
      );
    const out = await cli('--from-topic', topic, '--hold', '--json');
    expect(out.code).toBe(1);
    const report = JSON.parse(out.stdout) as {
      rebuilt: unknown[];
      incomplete: Array<{ taskId: string }>;
      quarantined: number;
      restoredInboxRows: number;
      restoredReceipts: number;
    };
    expect(report).toMatchObject({
      rebuilt: [{ taskId: 'RC-1', from: 1, to: 2 }],
      incomplete: [{ taskId: 'RC-GAP' }],
      quarantined: 1,
      restoredInboxRows: 1,
      restoredReceipts: 1,
    });
    const inbox = await dbs.b.db
      .selectFrom('inbox')
      .select(['message_id', 'tenant_id'])
      .where('consumer_group', '=', group)
      .execute();
    expect(inbox).toEqual([{ message_id: 'go-RC-1', tenant_id: 'acme' }]);
    // Region B's tester asks for the same deploy: the restored receipt says it ran; it does not run again.
    const again = await deploy(dbs.b.db, 'tester-b');
    expect(again).toMatchObject({ status: 'succeeded', result: { deployed: true } }); // not only its digest
    expect(ran).toBe(1);
    expect(
      await dbs.b.db
        .selectFrom('task_quarantine')
        .select('task_id')
        .where('released_at', 'is', null)
        .where('task_id', 'like', 'RC-%')
        .execute(),
    ).toEqual([{ task_id: 'RC-GAP' }]);
    // Run again: nothing to do for RC-1, RC-GAP still not provable (exit 1), no second hold.
    const second = JSON.parse((await cli('--from-topic', topic, '--hold', '--json')).stdout) as typeof report;
    expect(second).toMatchObject({ rebuilt: [], quarantined: 0, restoredInboxRows: 0, restoredReceipts: 0 });
  });

  it("a record naming another tenant's consumption, or a handler replayed in part, restores no inbox row", async () => {
    const { topic, stage, A, B } = await regions();
    for (const id of ['MAL-1', 'FAN-1', 'FAN-2'])
      await both([A, B], (s) =>
        s.create({ task: newTask(id, id === 'MAL-1' ? { tenant_id: 'mallory' } : {}), actor: AGENT }),
      );
    const producer = kafka.producer();
    await producer.connect();
    await producer.send({
      topic: stage,
      messages: [
        { key: 'x', value: '{}', headers: { 'cairn-message-id': 'acme-msg', 'cairn-tenant': 'acme' } },
        { key: 'y', value: '{}', headers: { 'cairn-message-id': 'fan-msg', 'cairn-tenant': 'acme' } },
      ],
    });
    await producer.disconnect();
    const consumedAs = (message_id: string) => ({
      consumer_group: 'G',
      message_id,
      topic: stage,
      partition: 0,
      offset: '0',
      key: null,
    });
    // Mallory's own task, changed in a "handler" that claims acme's message (its own SQL could
    // write such a row; here through the library's own mark).
    await dbs.a.db.transaction().execute(async (trx) => {
      const mark = consumptionMark(trx);
      mark.applying(consumedAs('acme-msg'));
      const u = await A.update({
        taskId: 'MAL-1',
        expectedVersion: 1,
        patch: planApproved(),
        actor: AGENT,
        trx,
      });
      if (!u.ok) throw u.error;
      await mark.finish();
    });
    // One message's handler changed two tasks; one record is lost.
    await dbs.a.db.transaction().execute(async (trx) => {
      const mark = consumptionMark(trx);
      mark.applying(consumedAs('fan-msg'));
      for (const id of ['FAN-1', 'FAN-2']) {
        const u = await A.update({
          taskId: id,
          expectedVersion: 1,
          patch: planApproved(),
          actor: AGENT,
          trx,
        });
        if (!u.ok) throw u.error;
      }
      await mark.finish();
    });
    await sql`DELETE FROM outbox WHERE task_id = 'FAN-2' AND topic = ${topic}`.execute(dbs.a.db);
    await publishA();
    const r = await replay(topic);
    expect(r.rebuilt.map((t) => t.taskId)).toEqual(['FAN-1', 'MAL-1']);
    expect(r.incomplete).toEqual([]); // FAN-2 lost its only record: nothing to see from the topic
    expect(r.restoredInboxRows).toBe(0);
    expect(r.inboxRowsNotRestored).toBe(2);
    expect(
      await dbs.b.db.selectFrom('inbox').select('message_id').where('consumer_group', '=', 'G').execute(),
    ).toEqual([]);
  });

  it('a record the database refuses (a forged transition) makes only its task not rebuilt; a deleted task is not recreated', async () => {
    const { topic, A, B } = await regions();
    for (const id of ['FORGED-T', 'OK-T', 'GONE-T'])
      await both([A, B], (s) => s.create({ task: newTask(id), actor: AGENT }));
    await A.update({ taskId: 'OK-T', expectedVersion: 1, patch: planApproved(), actor: AGENT });
    await A.update({ taskId: 'GONE-T', expectedVersion: 1, patch: planApproved(), actor: AGENT });
    await sql`DELETE FROM task_state WHERE task_id = 'GONE-T'`.execute(dbs.b.db);
    await publishA();
    // A record with a valid chain and digests for a transition the state machine forbids.
    const prev = (await docOf(dbs.b.db, 'FORGED-T'))!.doc as Record<string, unknown>;
    const next = { ...prev, version: 2, status: 'complete' };
    const fjp = (await import('fast-json-patch')).default;
    await produce(topic, {
      format: 'cairn.changelog.v1',
      tenant_id: 'acme',
      task_id: 'FORGED-T',
      version: 2,
      prev_version: 1,
      body: {
        actor: AGENT,
        reason: null,
        patch: fjp.compare(prev, next),
        prev_state_sha256: stateDigest(prev),
        state_sha256: stateDigest(next),
        status: 'complete',
        schema_version: String(prev.schema_version),
        messages: [],
        receipts: [],
        consumed: null,
      },
    });
    const r = await replay(topic);
    expect(r.rebuilt.map((t) => t.taskId)).toEqual(['OK-T']);
    expect(r.incomplete).toEqual([
      expect.objectContaining({ taskId: 'FORGED-T', reason: expect.stringMatching(/database refused it/) }),
    ]);
    expect(r.refused.map((x) => x.reason)).toEqual([
      expect.stringMatching(/GONE-T has audit rows here but no row/),
    ]);
  });

  it('a change whose record would be over the payload limit still commits; its replay holds the task', async () => {
    const { topic, A, B } = await regions();
    await both([A, B], (s) => s.create({ task: newTask('BIG-1'), actor: AGENT }));
    const files = Array.from({ length: 9_500 }, (_, i) => `src/${'deeply/nested/'.repeat(9)}module-${i}.ts`);
    const u = await A.update({
      taskId: 'BIG-1',
      expectedVersion: 1,
      patch: { status: 'implementing', gates: { plan_approved: true }, artifacts: { code_files: files } },
      actor: AGENT,
    });
    expect(u.ok).toBe(true);
    await publishA();
    const r = await replay(topic);
    expect(r.incomplete).toEqual([
      expect.objectContaining({ taskId: 'BIG-1', reason: expect.stringMatching(/too large to publish/) }),
    ]);
  });
});
