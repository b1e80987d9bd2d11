import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { promisify } from 'node:util';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import type { Db } from '../../src/db/database.js';
import { laneOf } from '../../src/outbox/lanes.js';
import type { SeenMessage } from '../../src/recovery/failover.js';
import { lostConsumptionsOnMirror, unmirroredMessages } from '../../src/recovery/failoverMirror.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask, planApproved } from '../state/fixtures.js';
import { cairnBundle } from '../support/cli.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

// The failover check on a mirror (region B's own Kafka, fed by MirrorMaker 2), against what
// its review found: another tenant's rows masking or inventing a loss, an observer's inbox row
// counting as delivery, a long topic, a broker that is down. Region B's database is this one;
// "published" is the relay's delete of the outbox row; the mirror is the `seen` list.

let t: TestDatabase;
let asB: Db;
let app: Db;
beforeAll(async () => {
  t = await createTestDatabase('failover_mirror');
  ({ asB, app } = await twoTenants(t));
});
afterAll(async () => {
  await app?.destroy();
  await t?.drop();
});

/** A task of tenant-a that passed a gate (a checkpoint at its version names its message), its message published. */
async function publishedTransition(taskId: string): Promise<string> {
  const store = createTaskStore({ db: t.db, checkpointer: createCheckpointer({ db: t.db }), cacheSize: 0 });
  await store.create({ task: newTask(taskId, { tenant_id: 'tenant-a' }), actor: AGENT });
  const r = await store.update({
    taskId,
    expectedVersion: 1,
    patch: planApproved('s3://p/1'),
    actor: AGENT,
    reason: 'plan approved',
    messages: [{ topic: 'cairn.tasks', payload: { stage: 'implementing' } }],
  });
  if (!r.ok) throw new Error('update');
  const [row] = await t.db
    .deleteFrom('outbox')
    .where('task_id', '=', taskId)
    .returning('message_id')
    .execute();
  return row!.message_id;
}

describe('unmirroredMessages: a message published in region A that never reached the mirror', () => {
  it('is reported for its task; on the mirror (same tenant) it is not', async () => {
    const m = await publishedTransition('M-1');
    expect(await unmirroredMessages(t.db, [], ['agents'])).toContainEqual({
      taskId: 'M-1',
      messageId: m,
      version: 2,
    });
    const seen = [{ messageId: m, tenant: 'tenant-a' } as SeenMessage];
    expect((await unmirroredMessages(t.db, seen, ['agents'])).map((u) => u.taskId)).not.toContain('M-1');
    // The same id under another tenant's header is another message.
    const other = [{ messageId: m, tenant: 'tenant-b' } as SeenMessage];
    expect((await unmirroredMessages(t.db, other, ['agents'])).map((u) => u.taskId)).toContain('M-1');
  });

  it("another tenant's outbox row keyed by this task's id is not this task's pending work: nothing is held for it", async () => {
    const store = createTaskStore({ db: t.db, checkpointer: createCheckpointer({ db: t.db }), cacheSize: 0 });
    await store.create({ task: newTask('M-2', { tenant_id: 'tenant-a' }), actor: AGENT });
    const planted = randomUUID();
    await sql`INSERT INTO outbox (lane, message_id, topic, key, headers, payload)
              VALUES (${laneOf('M-2')}, ${planted}::uuid, 'evil.private', 'M-2', '{}', '\\x00')`.execute(asB);
    await store.update({
      taskId: 'M-2',
      expectedVersion: 1,
      patch: planApproved('s3://p/2'),
      actor: AGENT,
      reason: 'plan approved',
    });
    // Published and deleted (the relay's part; tenants delete no outbox row since migration 0015).
    await sql`DELETE FROM outbox WHERE message_id = ${planted}::uuid`.execute(t.db);
    const docs = await t.db.selectFrom('checkpoint').select('doc').where('task_id', '=', 'M-2').execute();
    expect(JSON.stringify(docs)).not.toContain(planted);
    expect((await unmirroredMessages(t.db, [], ['agents'])).map((u) => u.taskId)).not.toContain('M-2');
  });

  it("another tenant's outbox row with this message's id does not hide its loss", async () => {
    const m = await publishedTransition('M-3');
    await sql`INSERT INTO outbox (lane, message_id, topic, key, headers, payload)
              VALUES (${laneOf('x')}, ${m}::uuid, 'evil.parked', 'x', '{}', '\\x00')`.execute(asB);
    expect((await unmirroredMessages(t.db, [], ['agents'])).map((u) => u.taskId)).toContain('M-3');
  });

  it("an observer group's inbox row is not delivery to the groups the operator named", async () => {
    const m = await publishedTransition('M-4');
    await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", tenant_id, key)
              VALUES ('observer', ${m}, 'cairn.tasks', 0, 0, 'tenant-a', 'M-4')`.execute(t.db);
    expect((await unmirroredMessages(t.db, [], ['agents'])).map((u) => u.taskId)).toContain('M-4');
    await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", tenant_id, key)
              VALUES ('agents', ${m}, 'cairn.tasks', 0, 0, 'tenant-a', 'M-4')`.execute(t.db);
    expect((await unmirroredMessages(t.db, [], ['agents'])).map((u) => u.taskId)).not.toContain('M-4');
  });
});

describe('lostConsumptionsOnMirror', () => {
  it('judges 70,000 messages a group committed past in one query (one parameter per id stopped at 65,535), by tenant and id', async () => {
    const messages: SeenMessage[] = Array.from({ length: 70_000 }, (_, i) => ({
      topic: 'A.cairn.tasks',
      partition: 0,
      offset: String(i),
      key: `k${i}`,
      tenant: 'tenant-a',
      taskId: `T-${i}`,
      version: 2,
      messageId: `m-${i}`,
    }));
    // The group applied all but the last; another tenant's row with that id does not count.
    await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", tenant_id, key)
              SELECT 'g', 'm-' || i, 'cairn.tasks', 0, i, 'tenant-a', 'k' FROM generate_series(0, 69998) i`.execute(
      t.db,
    );
    await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", tenant_id, key)
              VALUES ('g', 'm-69999', 'cairn.tasks', 0, 0, 'tenant-b', 'k')`.execute(t.db);
    const lost = await lostConsumptionsOnMirror(
      t.db,
      'g',
      [{ topic: 'A.cairn.tasks', partitions: [{ partition: 0, offset: '70000' }] }],
      messages,
    );
    expect(lost.map((l) => l.messageId)).toEqual(['m-69999']);
  });
});

describe('cairn failover check against a mirror whose broker is down', () => {
  it('exits 75 (unavailable, retriable), concluding nothing', async () => {
    const r = await promisify(execFile)(
      process.execPath,
      [cairnBundle(), 'failover', 'check', '--source-prefix', 'A.', '--topics', 'A.cairn.tasks', '--json'],
      { cwd: repoRoot, env: { ...process.env, KAFKA_BROKERS: '127.0.0.1:1', DATABASE_URL: t.url } },
    ).then(
      () => ({ code: 0, stderr: '', stdout: '' }),
      (e: { code: number; stderr: string; stdout: string }) => e,
    );
    expect(r.code).toBe(75);
    expect(r.stdout).toBe('');
    expect(JSON.parse(r.stderr.trim().split('\n').at(-1)!)).toMatchObject({
      error: { code: 'unavailable', retriable: true },
    });
  });
});
