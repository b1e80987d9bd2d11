import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys, type TenantKeys } from '../../src/crypto/tenantKeys.js';
import type { Db } from '../../src/db/database.js';
import { UnavailableError } from '../../src/errors.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { type ReplayChangelogOptions, replayChangelog } from '../../src/recovery/replayChangelog.js';
import {
  type ChangelogEnvelope,
  type ChangelogOptions,
  consumptionMark,
  stateDigest,
} from '../../src/state/changelog.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask, planApproved } from '../state/fixtures.js';
import { cairnBundle } from '../support/cli.js';
import { switchableProvider } from '../support/keyProviders.js';
import { createTestTopic, kafkaBrokers } from '../support/testDatabase.js';
import { runRegionAAgent } from './regionAgent.js';
import { clock, publishAll, useTwoRegions } from './twoRegions.js';

/**
 * Issue 20. Region A and region B are two databases: both run the same changes up to the cut
 * (same clock, so the same documents: B is A's replica), then A goes on alone and its relay
 * publishes, changelog included. B then replays what it lost from the topic.
 */
const dbs = useTwoRegions('changelog');
const kafka = kafkaClient(kafkaBrokers(), 'changelog-test');
/** What the replay reads the broker with (the client CAIRN_KAFKA_CLIENT names). */
const reader = dbs.reader;
const ring = { current: 'k1', keys: { k1: randomBytes(32) } };

/** A pair of stores, region A's and region B's, writing the same changelog topic. */
async function regions(changelog: Omit<ChangelogOptions, 'topic'> = {}, keys?: [TenantKeys, TenantKeys]) {
  const topic = await createTestTopic('changelog', 2);
  const stage = await createTestTopic('changelog-stage', 2);
  const store = (db: Db, k?: TenantKeys) =>
    createTaskStore({
      db,
      clock,
      // The default cache: a record's previous-state digest then comes from the store's last
      // write, and must equal the digest of the row as region B reads it.
      changelog: { topic, ...changelog },
      ...(k ? { keys: k } : {}),
    });
  return { topic, stage, A: store(dbs.a.db, keys?.[0]), B: store(dbs.b.db, keys?.[1]) };
}

async function both(stores: TaskStore[], f: (s: TaskStore) => Promise<unknown>) {
  for (const s of stores) await f(s);
}

const publishA = () => publishAll(dbs.a.db, "region A's outbox");

const replay = (topic: string, extra: Partial<ReplayChangelogOptions> = {}) =>
  replayChangelog(dbs.b.db, reader, {
    topic,
    actor: 'spiffe://acme.example/operator',
    deadlineMs: 30_000,
    ...extra,
  });

async function docOf(db: Db, taskId: string) {
  return db
    .selectFrom('task_state')
    .select(['version', 'doc'])
    .where('task_id', '=', taskId)
    .executeTakeFirst();
}

/** Publishes a hand-made record with the headers the relay would give an outbox row of `tenant`. */
async function produce(topic: string, e: ChangelogEnvelope, tenant = e.tenant_id, version = e.version) {
  const producer = kafka.producer();
  await producer.connect();
  await producer.send({
    topic,
    messages: [
      {
        key: e.task_id,
        value: JSON.stringify(e),
        headers: {
          'cairn-message-id': `forged-${Math.random()}`,
          'cairn-tenant': tenant,
          'cairn-task-id': e.task_id,
          'cairn-task-version': String(version),
        },
      },
    ],
  });
  await producer.disconnect();
}

async function recordsOn(topic: string): Promise<ChangelogEnvelope[]> {
  const { readTopicsToEnd } = await import('../../src/recovery/failover.js');
  return (await readTopicsToEnd(reader, [topic], 30_000, { values: true })).map(
    (m) => JSON.parse(m.value!.toString()) as ChangelogEnvelope,
  );
}

describe('changelog replay after an asynchronous failover', () => {
  it('rebuilds the lost versions (and a task lost entirely) with digests equal to region A, once', async () => {
    const { topic, stage, A, B } = await regions({ keyRing: ring });
    await both([A, B], (s) => s.create({ task: newTask('CL-1'), actor: AGENT }));
    // Region A alone: two transitions with a message each, and a task B never saw.
    const r2 = await A.update({
      taskId: 'CL-1',
      expectedVersion: 1,
      patch: planApproved(),
      actor: AGENT,
      reason: 'plan approved',
      messages: [{ topic: stage, payload: { next: 'implement' } }],
    });
    expect(r2.ok).toBe(true);
    await A.update({
      taskId: 'CL-1',
      expectedVersion: 2,
      patch: { gates: { implementation_complete: true }, artifacts: { code_files: ['src/a.ts'] } },
      actor: AGENT,
      messages: [{ topic: stage, payload: { next: 'review' } }],
    });
    await A.create({ task: newTask('CL-2'), actor: AGENT });
    await publishA();

    const first = await replay(topic, { keyRing: ring });
    expect(first.incomplete).toEqual([]);
    expect(first.refused).toEqual([]);
    expect(first.rebuilt).toEqual([
      { taskId: 'CL-1', tenantId: 'acme', from: 1, to: 3 },
      { taskId: 'CL-2', tenantId: 'acme', from: 0, to: 1 },
    ]);
    for (const id of ['CL-1', 'CL-2']) {
      const [inA, inB] = [await docOf(dbs.a.db, id), await docOf(dbs.b.db, id)];
      expect(inB?.version).toBe(inA?.version);
      expect(stateDigest(inB?.doc)).toBe(stateDigest(inA?.doc));
    }
    const audit = await dbs.b.db
      .selectFrom('task_audit')
      .select(['version', 'actor', 'reason'])
      .where('task_id', '=', 'CL-1')
      .orderBy('version')
      .execute();
    expect(audit.map((r) => r.version)).toEqual([1, 2, 3]);
    expect(audit[1]).toMatchObject({
      actor: AGENT,
      reason: expect.stringMatching(/^replayed from changelog .*: plan approved$/),
    });

    // Run twice: nothing changes the second time.
    const second = await replay(topic, { keyRing: ring });
    expect(second.rebuilt).toEqual([]);
    expect(second.incomplete).toEqual([]);
    expect(second.upToDate).toBe(2);
    expect(
      await dbs.b.db.selectFrom('task_audit').select('version').where('task_id', '=', 'CL-1').execute(),
    ).toHaveLength(3);
  });

  it('a gap, a forged or a reordered record rebuilds nothing of its task and reports it', async () => {
    const { topic, A, B } = await regions();
    for (const id of ['GAP', 'FORGED', 'REORDERED', 'SIGNED'])
      await both([A, B], (s) => s.create({ task: newTask(id), actor: AGENT }));
    for (const id of ['GAP', 'FORGED', 'REORDERED']) {
      await A.update({ taskId: id, expectedVersion: 1, patch: planApproved(), actor: AGENT });
      await A.update({
        taskId: id,
        expectedVersion: 2,
        patch: { gates: { implementation_complete: true } },
        actor: AGENT,
      });
    }
    // GAP: version 2's record never left region A (lost, or not mirrored yet).
    await sql`DELETE FROM outbox WHERE task_id = 'GAP' AND task_version = 2 AND topic = ${topic}`.execute(
      dbs.a.db,
    );
    // FORGED: version 2's record rewritten in the outbox (its patch says something else).
    await sql`UPDATE outbox SET payload = convert_to(replace(convert_from(payload, 'UTF8'), 's3://plans/1', 's3://plans/evil'), 'UTF8')
               WHERE task_id = 'FORGED' AND task_version = 2 AND topic = ${topic}`.execute(dbs.a.db);
    await publishA();
    // REORDERED: version 3's record presented as version 2 (headers included), before the real one.
    const records = await recordsOn(topic);
    const v3 = records.find((r) => r.task_id === 'REORDERED' && r.version === 3)!;
    const first = await replay(topic);
    expect(first.incomplete.map((i) => i.taskId)).toEqual(['FORGED', 'GAP']);
    expect(first.incomplete.find((i) => i.taskId === 'GAP')?.reason).toMatch(/gap: no record of version 2/);
    expect(first.incomplete.find((i) => i.taskId === 'FORGED')?.reason).toMatch(/digest/);
    expect(first.rebuilt.map((r) => r.taskId)).toEqual(['REORDERED']);

    // Reordered, on a task B has at 1: v3's record relabelled 2 does not follow B's state.
    await both([B], (s) => s.create({ task: newTask('REORDERED-2'), actor: AGENT }));
    await produce(topic, { ...v3, task_id: 'REORDERED-2', version: 2, prev_version: 1 });
    // SIGNED: with a key ring, an unsigned (or re-signed by another key) record is refused.
    await A.update({ taskId: 'SIGNED', expectedVersion: 1, patch: planApproved(), actor: AGENT });
    await publishA();
    const again = await replay(topic, { keyRing: ring });
    expect(again.incomplete.find((i) => i.taskId === 'REORDERED-2')?.reason).toMatch(
      /not signed|follows a state/,
    );
    expect(again.incomplete.find((i) => i.taskId === 'SIGNED')?.reason).toMatch(/not signed but a key ring/);
    const unsignedRing = await replay(topic);
    expect(unsignedRing.incomplete.find((i) => i.taskId === 'REORDERED-2')?.reason).toMatch(
      /follows a state/,
    );
    for (const id of ['GAP', 'FORGED', 'REORDERED-2']) {
      expect((await docOf(dbs.b.db, id))?.version).toBe(1);
    }
  });

  it("a record of tenant A's outbox cannot be replayed into tenant B's task", async () => {
    const { topic, A, B } = await regions();
    await both([A, B], (s) => s.create({ task: newTask('VICTIM', { tenant_id: 'tenant-b' }), actor: AGENT }));
    await A.update({ taskId: 'VICTIM', expectedVersion: 1, patch: planApproved(), actor: AGENT });
    await publishA();
    const [real] = (await recordsOn(topic)).filter((r) => r.task_id === 'VICTIM');
    // Tenant A writes (its own outbox row: the relay stamps tenant-a) a copy claiming tenant B's task.
    await produce(topic, { ...real!, version: 3, prev_version: 2 }, 'tenant-a');
    // And one claiming to be its own record for tenant B's task id.
    await produce(topic, { ...real!, tenant_id: 'tenant-a', version: 3, prev_version: 2 }, 'tenant-a');
    const r = await replay(topic);
    expect(r.refused.map((x) => x.reason).sort()).toEqual([
      expect.stringMatching(/came from an outbox row of tenant-a/),
      expect.stringMatching(/records of tenant tenant-a for task VICTIM, a task of another tenant/),
    ]);
    expect(r.rebuilt).toEqual([{ taskId: 'VICTIM', tenantId: 'tenant-b', from: 1, to: 2 }]);
    expect((await docOf(dbs.b.db, 'VICTIM'))?.version).toBe(2);
  });

  it('a task retention deleted here is not brought back by its records still on the topic', async () => {
    const { topic, A } = await regions();
    await A.create({ task: newTask('DELETED-1'), actor: AGENT });
    await publishA();
    await sql`INSERT INTO deletion_certificate (certificate_id, run_id, tenant_id, body, digest)
              VALUES (gen_random_uuid(), gen_random_uuid(), 'acme',
                      ${JSON.stringify({ tasks: [{ task_id: 'DELETED-1', version: 1 }] })}::jsonb, 'sha256:x')`.execute(
      dbs.b.db,
    );
    const r = await replay(topic);
    expect(r.rebuilt).toEqual([]);
    expect(r.refused).toEqual([
      { at: expect.any(String), reason: expect.stringMatching(/DELETED-1 .* deleted by retention here/) },
    ]);
    expect(await docOf(dbs.b.db, 'DELETED-1')).toBeUndefined();
  });

  it('records are encrypted with the tenant key; shredding the key makes them unreadable', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'cairn-changelog-keys-'));
    writeKeyring(join(dir, 'keyring.json'));
    const keysA = createTenantKeys({ db: dbs.a.db, provider: localKeyring(join(dir, 'keyring.json')) });
    const kms = switchableProvider(localKeyring(join(dir, 'keyring.json')));
    const keysB = createTenantKeys({ db: dbs.b.db, provider: kms.provider });
    await keysA.addTenant('enc');
    // Region B is A's replica: the same wrapped data key.
    const key = await dbs.a.db
      .selectFrom('tenant_key')
      .selectAll()
      .where('tenant_id', '=', 'enc')
      .executeTakeFirstOrThrow();
    await keysB.addTenant('enc');
    await dbs.b.db.deleteFrom('tenant_key').where('tenant_id', '=', 'enc').execute();
    await dbs.b.db.insertInto('tenant_key').values(key).execute();
    const { topic, A, B } = await regions({}, [keysA, keysB]);
    await both([A, B], (s) => s.create({ task: newTask('ENC-1', { tenant_id: 'enc' }), actor: AGENT }));
    await A.update({
      taskId: 'ENC-1',
      expectedVersion: 1,
      patch: {
        status: 'implementing',
        gates: { plan_approved: true },
        artifacts: { implementation_plan: 's3://plans/TOP-SECRET-7' },
      },
      actor: AGENT,
      reason: 'reason TOP-SECRET-7',
    });
    await publishA();
    const raw = (await recordsOn(topic)).map((r) => JSON.stringify(r));
    expect(raw.length).toBeGreaterThan(0);
    for (const r of raw) expect(r).not.toContain('TOP-SECRET-7');
    expect(JSON.parse(raw.at(-1)!)).toMatchObject({ sealed: { key_id: key.key_id } });
    // No keys configured is an outage of configuration, not a bad record: nothing concluded.
    await expect(replay(topic)).rejects.toThrow(/encrypted and no tenant keys were given/);
    await sql`DELETE FROM tenant_key WHERE tenant_id = 'enc'`.execute(dbs.b.db);
    const shredded = await replay(topic, { keys: keysB });
    expect(shredded.incomplete[0]?.reason).toMatch(/cannot be read/);
    await dbs.b.db.insertInto('tenant_key').values(key).execute();
    // The key provider down is an outage, not a bad record: the replay stops, nothing written.
    // (A fresh process's keys: region B's store above has the data key unwrapped already.)
    const replayKeys = createTenantKeys({ db: dbs.b.db, provider: kms.provider });
    kms.s.down = true;
    await expect(replay(topic, { keys: replayKeys })).rejects.toBeInstanceOf(UnavailableError);
    expect((await docOf(dbs.b.db, 'ENC-1'))?.version).toBe(1);
    kms.s.down = false;
    const readable = await replay(topic, { keys: replayKeys });
    expect(readable.rebuilt).toEqual([{ taskId: 'ENC-1', tenantId: 'enc', from: 1, to: 2 }]);
    expect(stateDigest((await docOf(dbs.b.db, 'ENC-1'))?.doc)).toBe(
      stateDigest((await docOf(dbs.a.db, 'ENC-1'))?.doc),
    );
  });

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
