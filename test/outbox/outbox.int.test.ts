import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { repoRoot } from '../../cli/stack/paths.js';
import { relayMetrics } from '../../relay/metrics.js';
import { createRelay, type Relay } from '../../relay/relay.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { startMetricsServer } from '../../src/metrics/metricsServer.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { cairnBundle } from '../support/cli.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase, uniqueTopic } from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';

const run = promisify(execFile);
let tdb: TestDatabase;
let relay: Relay;
let relayDone: Promise<void>;
const kafka = kafkaClient(kafkaBrokers(), 'outbox-test');
const topic = uniqueTopic('outbox');
const smallTopic = uniqueTopic('outbox-small'); // refuses messages over 1 KB
const outbox = createOutbox({
  schemas: { [topic]: z.strictObject({ kind: z.string(), n: z.number().int() }) },
});

async function outboxCount(): Promise<number> {
  const r = await tdb.db
    .selectFrom('outbox')
    .select((eb) => eb.fn.countAll<number>().as('n'))
    .executeTakeFirstOrThrow();
  return Number(r.n);
}

beforeAll(async () => {
  tdb = await createTestDatabase('outbox');
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({
    topics: [
      { topic, numPartitions: 3 },
      { topic: smallTopic, numPartitions: 1, configEntries: [{ name: 'max.message.bytes', value: '1024' }] },
    ],
    waitForLeaders: true,
  });
  await admin.disconnect();
});
afterAll(async () => {
  await relay?.stop();
  await relayDone;
  await tdb.drop();
});

describe('outbox enqueue', () => {
  it('refuses bad messages before commit, naming the field, and writes nothing', async () => {
    const bad: Array<[object, RegExp]> = [
      [
        { topic: 'no spaces allowed', key: 'k', payload: { kind: 'x', n: 1 } },
        /topic: must be 1-249 characters/,
      ],
      [{ topic, payload: { kind: 'x', n: 1 } }, /key: is required/],
      [{ topic, key: 'k', payload: { kind: 'x', n: 'one' } }, /payload\.n: .*(got "one")/],
      [
        { topic, key: 'k', payload: Buffer.alloc(2 * 1024 * 1024) },
        /payload: is 2097152 bytes, over the limit of 1048576/,
      ],
      [{ topic, key: 'k', payload: {}, colour: 'red' }, /unknown key\(s\) "colour"/],
      [{ topic, key: '鍵'.repeat(1000), payload: { kind: 'x', n: 1 } }, /key: must be at most 2048 bytes/],
      [
        {
          topic,
          key: 'k',
          payload: { kind: 'x', n: 1 },
          headers: { a: 'v'.repeat(8000), b: 'v'.repeat(8000) },
        },
        /headers: must be at most 12 KiB in all/,
      ],
    ];
    for (const [message, error] of bad) {
      await expect(
        tdb.db.transaction().execute((t) => outbox.enqueue(t, [message as never])),
        JSON.stringify(message).slice(0, 60),
      ).rejects.toThrow(error);
    }
    expect(await outboxCount()).toBe(0);
  });

  it('a task update and its messages commit together; a stale update enqueues nothing', async () => {
    const store = createTaskStore({ db: tdb.db, outbox });
    await store.create({ task: newTask('ob-1'), actor: AGENT });
    const ok = await store.update({
      taskId: 'ob-1',
      expectedVersion: 1,
      patch: { status: 'implementing' },
      actor: AGENT,
      messages: [
        {
          topic,
          payload: { kind: 'started', n: 1 },
          traceparent: `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`,
        },
      ],
    });
    expect(ok.ok && ok.messageIds.length).toBe(1);
    const row = await tdb.db.selectFrom('outbox').selectAll().executeTakeFirstOrThrow();
    // Cairn's own headers are columns (the relay builds them); only the caller's are stored.
    expect(row).toMatchObject({
      topic,
      key: 'ob-1',
      tenant_id: 'acme',
      task_id: 'ob-1',
      task_version: 2,
      task_seq: 0,
    });
    expect(row.headers).toEqual({ traceparent: `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01` });

    const stale = await store.update({
      taskId: 'ob-1',
      expectedVersion: 1,
      patch: { status: 'failed' },
      actor: AGENT,
      messages: [{ topic, payload: { kind: 'failed', n: 2 } }],
    });
    expect(stale.ok).toBe(false);
    expect(await outboxCount()).toBe(1);
    // A bad message refuses the whole update: the state does not move either.
    await expect(
      store.update({
        taskId: 'ob-1',
        expectedVersion: 2,
        patch: { status: 'reviewing' },
        actor: AGENT,
        messages: [{ topic, payload: { kind: 1 } }],
      }),
    ).rejects.toThrow(/payload\.kind/);
    expect((await store.get('ob-1'))?.version).toBe(2);
  });

  it('an idempotency key gives the same message_id every time', async () => {
    const ids = await Promise.all(
      [1, 2].map(() =>
        tdb.db.transaction().execute(async (t) => {
          const [id] = await outbox.enqueue(t, [
            { topic, key: `idem-${Math.random()}`, payload: { kind: 'x', n: 1 }, idempotencyKey: 'order-42' },
          ]);
          await sql`DELETE FROM outbox WHERE message_id = ${id!}::uuid`.execute(t);
          return id;
        }),
      ),
    );
    expect(ids[0]).toBe(ids[1]);
  });
});

describe('relay to a real broker', () => {
  beforeAll(() => {
    relay = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      leaseTtlMs: 3000,
      maxIdleMs: 50,
    });
    relayDone = relay.run();
  });

  it('delivers a lower id whose transaction commits after higher ids were published', async () => {
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    let heldId = '';
    let heldRowId = 0;
    const late = tdb.db.transaction().execute(async (t) => {
      heldId = (await outbox.enqueue(t, [{ topic, key: 'late', payload: { kind: 'late', n: 0 } }]))[0]!;
      heldRowId = (
        await t.selectFrom('outbox').select('id').where('message_id', '=', heldId).executeTakeFirstOrThrow()
      ).id;
      await held; // keep the transaction (and its lower id) open
    });
    await waitFor('the held message id', () => heldId !== '');
    const early: string[] = [];
    const earlyRowIds: number[] = [];
    for (let i = 1; i <= 5; i++) {
      await tdb.db.transaction().execute(async (t) => {
        const [id] = await outbox.enqueue(t, [
          { topic, key: `early-${i}`, payload: { kind: 'early', n: i } },
        ]);
        early.push(id!);
        const row = await t
          .selectFrom('outbox')
          .select('id')
          .where('message_id', '=', id!)
          .executeTakeFirstOrThrow();
        earlyRowIds.push(row.id);
      });
    }
    // The held transaction took its id first: a cursor on ids would have skipped it.
    expect(Math.min(...earlyRowIds)).toBeGreaterThan(heldRowId);
    await waitFor(
      'the early messages to be published',
      async () =>
        (await tdb.db.selectFrom('outbox').select('id').where('message_id', 'in', early).execute()).length ===
        0,
    );
    release();
    await late;
    const want = [heldId, ...early];
    const got = await readTopic(
      kafka,
      topic,
      (ms) => want.every((id) => ms.some((m) => m.headers['cairn-message-id'] === id)),
      30_000,
    );
    expect(got.map((m) => m.headers['cairn-message-id'])).toContain(heldId);
    expect(got.map((m) => m.headers['cairn-message-id'])).toEqual(expect.arrayContaining(early));
  });

  it('a message the broker refuses parks its key only; release and skip work and are audited', async () => {
    const enqueue = (key: string, bytes: number, n: number) =>
      tdb.db
        .transaction()
        .execute(
          async (t) =>
            (
              await outbox.enqueue(t, [
                { topic: smallTopic, key, payload: Buffer.from(`${n}:`.padEnd(bytes, 'x')) },
              ])
            )[0]!,
        );
    const poison = await enqueue('poisoned', 4000, 1);
    const behind = await enqueue('poisoned', 10, 2);
    const others = [await enqueue('healthy-a', 10, 3), await enqueue('healthy-b', 10, 4)];

    await waitFor(
      'the key to be parked',
      async () => (await tdb.db.selectFrom('outbox_parked_key').selectAll().execute()).length === 1,
    );
    await waitFor(
      'healthy keys to flow',
      async () =>
        (await tdb.db.selectFrom('outbox').select('message_id').where('message_id', 'in', others).execute())
          .length === 0,
    );
    const parkedCli = await run(process.execPath, [cairnBundle(), 'outbox', 'parked'], {
      cwd: repoRoot,
      env: { ...process.env, DATABASE_URL: tdb.url },
    });
    expect(parkedCli.stdout).toMatch(
      new RegExp(`${smallTopic}\\tpoisoned\\thead ${poison}\\t2 waiting.*larger than the max message size`),
    );
    // The message behind the poison waits: order per key.
    expect(
      await tdb.db.selectFrom('outbox').select('message_id').where('message_id', '=', behind).execute(),
    ).toHaveLength(1);

    // Releasing without fixing anything parks it again at the same head.
    await run(
      process.execPath,
      [
        cairnBundle(),
        'outbox',
        'release',
        'poisoned',
        '--topic',
        smallTopic,
        '--reason',
        'retry after broker config change',
      ],
      {
        cwd: repoRoot,
        env: { ...process.env, DATABASE_URL: tdb.url },
      },
    );
    await waitFor(
      'the key to be parked again',
      async () => (await tdb.db.selectFrom('outbox_parked_key').selectAll().execute()).length === 1,
    );

    await run(
      process.execPath,
      [cairnBundle(), 'outbox', 'skip', poison, '--reason', 'payload too large, resent as pointer'],
      {
        cwd: repoRoot,
        env: { ...process.env, DATABASE_URL: tdb.url },
      },
    );
    await waitFor(
      'the waiting message to flow',
      async () =>
        (await tdb.db.selectFrom('outbox').select('message_id').where('message_id', '=', behind).execute())
          .length === 0,
    );
    const got = await readTopic(kafka, smallTopic, (ms) => ms.length >= 3, 30_000);
    expect(got.map((m) => m.headers['cairn-message-id']).sort()).toEqual([behind, ...others].sort());
    const audit = await tdb.db
      .selectFrom('outbox_operator_audit')
      .select(['action', 'key', 'message_id', 'reason'])
      .orderBy('id')
      .execute();
    expect(audit).toEqual([
      { action: 'release', key: 'poisoned', message_id: poison, reason: 'retry after broker config change' },
      { action: 'skip', key: 'poisoned', message_id: poison, reason: 'payload too large, resent as pointer' },
    ]);
  });

  it('serves Prometheus metrics, /healthz and /readyz', async () => {
    const server = await startMetricsServer({
      registry: relayMetrics(relay, tdb.db),
      port: 0,
      ready: () => relay.stats().lanesOwned > 0,
    });
    try {
      const base = `http://127.0.0.1:${server.port}`;
      const metrics = await (await fetch(`${base}/metrics`)).text();
      expect(metrics).toMatch(/^cairn_relay_published_total [1-9]\d*$/m);
      expect(metrics).toMatch(/^cairn_relay_lanes_owned 32$/m);
      expect(metrics).toMatch(/^cairn_outbox_backlog \d+$/m);
      expect(metrics).toMatch(/^cairn_outbox_parked_keys \d+$/m);
      // The histograms count what was published since the registry was made.
      expect(metrics).toMatch(/^cairn_relay_commit_to_publish_seconds_count \d+$/m);
      expect(metrics).toMatch(/^cairn_relay_batch_size_bucket\{le="\+Inf"\} \d+$/m);
      expect((await fetch(`${base}/healthz`)).status).toBe(200);
      expect((await fetch(`${base}/readyz`)).status).toBe(200);
    } finally {
      await server.close();
    }
  });
});
