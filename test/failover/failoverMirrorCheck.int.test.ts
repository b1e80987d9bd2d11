import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { promisify } from 'node:util';
import type { Kafka } from 'kafkajs';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { registerTenant } from '../../src/db/tenant.js';
import { ValidationError } from '../../src/errors.js';
import { createKafkaAdmin, type KafkaAdmin } from '../../src/kafka/admin.js';
import { createTopicsAndWait } from '../../src/kafka/kafkajsAdmin.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
import { HEADER } from '../../src/outbox/wire.js';
import { checkAfterFailover } from '../../src/recovery/failover.js';
import { holdDiverged } from '../../src/recovery/failoverHold.js';
import { runRetention, setRetentionPolicy } from '../../src/retention/retention.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask, planApproved } from '../state/fixtures.js';
import { cairnBundle } from '../support/cli.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase, uniqueTopic } from '../support/testDatabase.js';

// The failover check on a mirror, against what its second review found: an unprefixed topic
// (an operator's slip, or this region's own relay publishing after the failover), a group
// MirrorMaker never checkpointed, the mirror's history older than retention here, a check run
// again after an operator's release, and MirrorMaker still copying during the check.
// The mirror is a topic named `A.<source>` on the test broker that this file writes as
// MirrorMaker would (the source's records and headers); a group's translated offsets are set
// on it as MirrorMaker's checkpoint sync does.

const PREFIX = 'A.';
let b: TestDatabase;
let kafka: Kafka;
/** What the check reads the broker with (the client CAIRN_KAFKA_CLIENT names). */
let reader: KafkaAdmin;
beforeAll(async () => {
  b = await createTestDatabase('failover_mirror_check');
  kafka = kafkaClient(kafkaBrokers(), 'failover-mirror-check');
  reader = createKafkaAdmin({ brokers: kafkaBrokers(), clientId: 'failover-mirror-check-reader' });
});
afterAll(async () => {
  await reader?.close();
  await b?.drop();
});

/** A source topic name and its mirror (`A.<source>`), the mirror created; `local` creates the source too. */
async function topics(
  label: string,
  o: { local?: boolean } = {},
): Promise<{ source: string; mirror: string }> {
  const source = uniqueTopic(label);
  const mirror = `${PREFIX}${source}`;
  const admin = kafka.admin();
  await admin.connect();
  try {
    await createTopicsAndWait(admin, [
      { topic: mirror, numPartitions: 1 },
      ...(o.local ? [{ topic: source, numPartitions: 1 }] : []),
    ]);
  } finally {
    await admin.disconnect();
  }
  return { source, mirror };
}

interface Sent {
  taskId: string;
  version: number;
  messageId?: string;
  tenant?: string;
  /** The record's timestamp (ms); the producer's clock otherwise. */
  timestamp?: number;
}

/** Writes messages as the relay (or MirrorMaker copying the relay's) would: Cairn's headers. */
async function send(topic: string, msgs: readonly Sent[]): Promise<string[]> {
  const producer = kafka.producer();
  await producer.connect();
  const ids = msgs.map((m) => m.messageId ?? randomUUID());
  try {
    await producer.send({
      topic,
      messages: msgs.map((m, i) => ({
        key: m.taskId,
        value: '{}',
        ...(m.timestamp === undefined ? {} : { timestamp: String(m.timestamp) }),
        headers: {
          [HEADER.messageId]: ids[i]!,
          [HEADER.tenant]: m.tenant ?? 'acme',
          [HEADER.taskId]: m.taskId,
          [HEADER.taskVersion]: String(m.version),
          [HEADER.taskSeq]: '0',
        },
      })),
    });
  } finally {
    await producer.disconnect();
  }
  return ids;
}

/** The group's offset on the mirror, as MirrorMaker's checkpoint sync writes it. */
async function translatedOffset(groupId: string, topic: string, offset: number): Promise<void> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    await admin.setOffsets({ groupId, topic, partitions: [{ partition: 0, offset: String(offset) }] });
  } finally {
    await admin.disconnect();
  }
}

/** A task at version 2 whose checkpoint names one message, its outbox row gone (published): its id. */
async function publishedTransition(taskId: string, topic: string): Promise<string> {
  const store = createTaskStore({ db: b.db, checkpointer: createCheckpointer({ db: b.db }), cacheSize: 0 });
  await store.create({ task: newTask(taskId), actor: AGENT });
  const r = await store.update({
    taskId,
    expectedVersion: 1,
    patch: planApproved(),
    actor: AGENT,
    reason: 'plan approved',
    messages: [{ topic, key: taskId, payload: {} }],
  });
  if (!r.ok) throw new Error('update');
  const [row] = await b.db
    .deleteFrom('outbox')
    .where('task_id', '=', taskId)
    .returning('message_id')
    .execute();
  return row!.message_id;
}

/** Runs `cairn <args>` against this file's database and the test broker. */
async function cli(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return promisify(execFile)(process.execPath, [cairnBundle(), ...args], {
    cwd: repoRoot,
    env: { ...process.env, KAFKA_BROKERS: kafkaBrokers().join(','), DATABASE_URL: b.url },
  }).then(
    (o) => ({ code: 0, stdout: o.stdout, stderr: o.stderr }),
    (e: { code: number; stdout: string; stderr: string }) => e,
  );
}

describe('sourcePrefix is compared with every topic named', () => {
  it('an unprefixed topic or group topic is refused with a ValidationError naming the field and value', async () => {
    const { source, mirror } = await topics('slip');
    const err = await checkAfterFailover(b.db, reader, {
      topics: [mirror, source],
      consumers: [{ groupId: 'g', topics: [source] }],
      sourcePrefix: PREFIX,
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ValidationError);
    expect((err as ValidationError).issues).toEqual([
      expect.objectContaining({ path: 'topics.1', value: source }),
      expect.objectContaining({ path: 'consumers.0.topics.0', value: source }),
    ]);
    expect((err as Error).message).toContain('A.<source topic>');
  });

  it("a message this region's relay published under the source name after the failover is no unmirrored message: the task is not held", async () => {
    const { source, mirror } = await topics('local', { local: true });
    const m = await publishedTransition('LOCAL-1', source);
    await send(source, [{ taskId: 'LOCAL-1', version: 2, messageId: m }]); // region B's relay
    const r = await checkAfterFailover(b.db, reader, {
      topics: [mirror],
      consumers: [{ groupId: `g-${randomUUID()}`, topics: [mirror] }],
      sourcePrefix: PREFIX,
    });
    expect(r.unmirroredMessages.map((u) => u.taskId)).not.toContain('LOCAL-1');
    expect(r.divergedTasks).not.toContain('LOCAL-1');
  });
});

describe('a group without translated offsets', () => {
  it('is reported as not judged, and the CLI prints it and does not exit 0', async () => {
    const { mirror } = await topics('nockpt');
    const store = createTaskStore({ db: b.db, cacheSize: 0 });
    await store.create({ task: newTask('NC-1'), actor: AGENT });
    await send(mirror, [{ taskId: 'NC-1', version: 1 }]);
    const judged = `g-judged-${randomUUID()}`;
    const unjudged = `g-unjudged-${randomUUID()}`;
    await translatedOffset(judged, mirror, 0);
    const r = await checkAfterFailover(b.db, reader, {
      topics: [mirror],
      consumers: [
        { groupId: judged, topics: [mirror] },
        { groupId: unjudged, topics: [mirror] },
      ],
      sourcePrefix: PREFIX,
    });
    expect(r.groupsNotJudged).toEqual([{ groupId: unjudged, topic: mirror, partitions: [0] }]);
    expect(r.divergedTasks).not.toContain('NC-1');

    const out = await cli(
      'failover',
      'check',
      '--source-prefix',
      PREFIX,
      '--topics',
      mirror,
      '--group',
      `${unjudged}=${mirror}`,
    );
    expect(out.stdout).toContain(`not judged: ${unjudged} on ${mirror} partition(s) 0`);
    expect(out.stdout).not.toContain('nothing lost that this region can see');
    expect(out.code).toBe(1);
  });
});

describe("the mirror's history older than retention here", () => {
  it('a task retention deleted is not lost; a task gone without a certificate still is', async () => {
    await registerTenant(b.db, 'ret');
    await setRetentionPolicy(b.db, { tenantId: 'ret', dataClass: 'internal', retainDays: 0 });
    const store = createTaskStore({ db: b.db, cacheSize: 0 });
    await store.create({ task: newTask('RET-1', { tenant_id: 'ret' }), actor: AGENT });
    const done = await store.update({
      taskId: 'RET-1',
      expectedVersion: 1,
      patch: { status: 'cancelled' },
      actor: AGENT,
    });
    expect(done.ok).toBe(true);
    const { mirror } = await topics('retention');
    const [m1, m2] = await send(mirror, [
      { taskId: 'RET-1', version: 1, tenant: 'ret' },
      { taskId: 'RET-1', version: 2, tenant: 'ret' },
    ]);
    // The group applied both (its inbox rows), then retention deleted the task and them.
    for (const [i, id] of [m1!, m2!].entries()) {
      await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", tenant_id, key)
                VALUES ('ret-g', ${id}, ${mirror.slice(PREFIX.length)}, 0, ${i}, 'ret', 'RET-1')`.execute(
        b.db,
      );
    }
    const run = await runRetention({ db: b.db, actor: AGENT, tenantId: 'ret' });
    expect(run.tasks).toEqual(['RET-1']);
    // A task of which nothing is left and no certificate speaks: a real loss.
    await send(mirror, [{ taskId: 'GONE-1', version: 1, tenant: 'ret' }]);
    await translatedOffset('ret-g', mirror, 3);
    const r = await checkAfterFailover(b.db, reader, {
      topics: [mirror],
      consumers: [{ groupId: 'ret-g', topics: [mirror] }],
      sourcePrefix: PREFIX,
    });
    expect(r.lostConsumptions.map((l) => l.taskId)).toEqual(['GONE-1']);
    expect(r.lostTransitions.map((l) => l.taskId)).toEqual(['GONE-1']);
    expect(r.divergedTasks).not.toContain('RET-1');
    expect(r.divergedTasks).toContain('GONE-1');
  });
  it('a message older than the inbox retention and the oldest row the group kept (pruned by age) is not lost; a recent one missing still is', async () => {
    const store = createTaskStore({ db: b.db, cacheSize: 0 });
    await store.create({ task: newTask('PRUNE-1'), actor: AGENT });
    const { mirror } = await topics('pruned');
    const [, kept] = await send(mirror, [
      { taskId: 'PRUNE-1', version: 1, timestamp: Date.now() - 2 * 86_400_000 }, // applied, row pruned
      { taskId: 'PRUNE-1', version: 1 }, // applied, row kept
      { taskId: 'PRUNE-1', version: 1 }, // applied in region A only: lost
    ]);
    await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", tenant_id, key)
              VALUES ('prune-g', ${kept!}, ${mirror.slice(PREFIX.length)}, 0, 1, 'acme', 'PRUNE-1')`.execute(
      b.db,
    );
    await translatedOffset('prune-g', mirror, 3);
    const r = await checkAfterFailover(b.db, reader, {
      topics: [mirror],
      consumers: [{ groupId: 'prune-g', topics: [mirror] }],
      sourcePrefix: PREFIX,
      inboxRetentionMs: 86_400_000, // the group's consumers keep inbox rows for a day
    });
    expect(r.lostConsumptions.map((l) => l.offset)).toEqual(['2']);
    // With the default retention (7 days) the 2-day-old message could not have been pruned: lost.
    const byDefault = await checkAfterFailover(b.db, reader, {
      topics: [mirror],
      consumers: [{ groupId: 'prune-g', topics: [mirror] }],
      sourcePrefix: PREFIX,
    });
    expect(byDefault.lostConsumptions.map((l) => l.offset)).toEqual(['0', '2']);
    // The operator's command says the same with the consumers' retention, and refuses a bad one.
    const args = [
      'failover',
      'check',
      '--source-prefix',
      PREFIX,
      '--topics',
      mirror,
      '--group',
      `prune-g=${mirror}`,
    ];
    const viaCli = await cli(...args, '--inbox-retention-hours', '24', '--json');
    expect(
      (JSON.parse(viaCli.stdout) as { lostConsumptions: Array<{ offset: string }> }).lostConsumptions.map(
        (l) => l.offset,
      ),
    ).toEqual(['2']);
    for (const bad of ['a day', '1e-9', '1e308']) {
      const refused = await cli(...args, '--inbox-retention-hours', bad);
      expect({ bad, code: refused.code }).toEqual({ bad, code: 2 });
      expect(refused.stderr).toContain(
        `--inbox-retention-hours must be a positive number of hours (got "${bad}")`,
      );
    }
  });
});

describe('a check run again after an operator released a task', () => {
  it('`check --hold` leaves it released while the findings are the same, and holds it again when something new is lost', async () => {
    const { mirror } = await topics('release');
    const store = createTaskStore({ db: b.db, cacheSize: 0 });
    await store.create({ task: newTask('REL-1'), actor: AGENT });
    await send(mirror, [{ taskId: 'REL-1', version: 3 }]); // region A got further than this database
    const checkHold = () => cli('failover', 'check', '--source-prefix', PREFIX, '--topics', mirror, '--hold');
    const active = () =>
      b.db
        .selectFrom('task_quarantine')
        .select('reason')
        .where('task_id', '=', 'REL-1')
        .where('released_at', 'is', null)
        .execute();
    expect((await checkHold()).code).toBe(1);
    expect(await active()).toHaveLength(1);
    expect((await cli('failover', 'release', 'REL-1')).code).toBe(0);

    const again = await checkHold();
    expect(again.stdout).toContain('left released (nothing new found since the release): REL-1');
    expect(await active()).toEqual([]);

    await send(mirror, [{ taskId: 'REL-1', version: 4 }]); // something new
    await checkHold();
    expect(await active()).toEqual([{ reason: expect.stringContaining('transition v4') }]);
    // The library's own answer, for a script that holds without the CLI.
    expect(
      (
        await holdDiverged(
          b.db,
          await checkAfterFailover(b.db, reader, { topics: [mirror], sourcePrefix: PREFIX }),
          { actor: AGENT },
        )
      ).held,
    ).not.toContain('REL-1');
  });
});

describe('MirrorMaker still copying during the check', () => {
  it('the end offsets that moved are reported (movedDuringCheck)', async () => {
    const { mirror } = await topics('moving');
    await send(mirror, [{ taskId: 'MOV-0', version: 1 }]);
    let copying = true;
    const copier = (async () => {
      while (copying) await send(mirror, [{ taskId: 'MOV-1', version: 1 }]);
    })();
    try {
      const r = await checkAfterFailover(b.db, reader, { topics: [mirror], sourcePrefix: PREFIX });
      expect(r.movedDuringCheck).toEqual([expect.objectContaining({ topic: mirror, partition: 0 })]);
      const [moved] = r.movedDuringCheck;
      expect(BigInt(moved!.after)).toBeGreaterThan(BigInt(moved!.before));
    } finally {
      copying = false;
      await copier;
    }
    const still = await checkAfterFailover(b.db, reader, { topics: [mirror], sourcePrefix: PREFIX });
    expect(still.movedDuringCheck).toEqual([]);
  });

  it("a group's translated offset that moved during the check (checkpoint sync still writing) is reported", async () => {
    const { mirror } = await topics('moving-group');
    await send(mirror, [{ taskId: 'MOVG-1', version: 1 }]);
    const group = `g-moving-${randomUUID()}`;
    // A member of the group committing ever higher offsets stands for the checkpoint sync.
    const member = kafka.consumer({ groupId: group, maxWaitTimeInMs: 100 });
    await member.connect();
    await member.subscribe({ topics: [mirror], fromBeginning: true });
    let joined!: () => void;
    const inGroup = new Promise<void>((r) => {
      joined = r;
    });
    await member.run({ eachMessage: async () => joined() });
    await inGroup;
    let syncing = true;
    const sync = (async () => {
      for (let n = 2; syncing; n++)
        await member.commitOffsets([{ topic: mirror, partition: 0, offset: String(n) }]);
    })();
    try {
      const r = await checkAfterFailover(b.db, reader, {
        topics: [mirror],
        consumers: [{ groupId: group, topics: [mirror] }],
        sourcePrefix: PREFIX,
      });
      expect(r.movedDuringCheck).toEqual([
        expect.objectContaining({ topic: mirror, partition: 0, groupId: group }),
      ]);
    } finally {
      syncing = false;
      await sync;
      await member.disconnect();
    }
  });
});
