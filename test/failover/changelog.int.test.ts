import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys } from '../../src/crypto/tenantKeys.js';
import { UnavailableError } from '../../src/errors.js';
import { stateDigest } from '../../src/state/changelog.js';
import { AGENT, newTask, planApproved } from '../state/fixtures.js';
import { switchableProvider } from '../support/keyProviders.js';
import { changelogHarness } from './changelogHarness.js';

/**
 * Issue 20. Region A and region B are two databases: both run the same changes up to the cut
 * (same clock, so the same documents: B is A's replica), then A goes on alone and its relay
 * publishes, changelog included. B then replays what it lost from the topic.
 */
const { dbs, ring, regions, both, publishA, replay, docOf, produce, recordsOn } =
  changelogHarness('changelog');

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
  // Review: key_missing also comes from a provider that lacks the key-encryption key (a keyring
  // loaded before a rotation): the changelog took it for "this tenant has no data key" and
  // wrote the record in the clear (reason, patch) to the outbox, the topic and every region.
  it('a data key this process cannot unwrap (its keyring read before a rotation) refuses the change; nothing in the clear', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'cairn-changelog-rotate-'));
    writeKeyring(join(dir, 'current.json'));
    await createTenantKeys({ db: dbs.a.db, provider: localKeyring(join(dir, 'current.json')) }).addTenant(
      'rot',
    );
    // This process's keyring lacks the key-encryption key the tenant's data key is wrapped under.
    writeKeyring(join(dir, 'old.json'));
    const stale = createTenantKeys({ db: dbs.a.db, provider: localKeyring(join(dir, 'old.json')) });
    const { A } = await regions({}, [stale, stale]);
    await expect(
      A.create({ task: newTask('ROT-1', { tenant_id: 'rot' }), actor: AGENT, reason: 'reason TOP-SECRET-8' }),
    ).rejects.toMatchObject({ code: 'key_missing' });
    const { rows } = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM task_state WHERE task_id = 'ROT-1'`.execute(dbs.a.db);
    expect(rows[0]?.n).toBe(0);
    const { rows: clear } = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM outbox WHERE convert_from(payload, 'UTF8') LIKE '%TOP-SECRET-8%'`.execute(
      dbs.a.db,
    );
    expect(clear[0]?.n).toBe(0);
  });
});
