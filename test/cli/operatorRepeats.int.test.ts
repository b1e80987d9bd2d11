import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { type Admin, Partitioners } from 'kafkajs';
import { sql } from 'kysely';
import { afterAll, beforeAll } from 'vitest';
import { kafkaClient } from '../../src/kafka/publisher.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { quarantine } from '../../src/recovery/failover.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase, uniqueTopic } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

import {
  type Case,
  dir,
  endOffset,
  extraDbs,
  inbox,
  OPERATOR,
  row,
  runCases,
  setUp,
  startInboxConsumer,
  store,
  suffix,
  t,
  task,
  tearDown,
} from './operatorRepeatsHarness.js';

const cases: Array<Case<unknown>> = [
  row<{ db: TestDatabase }>({
    command: 'migrate',
    async setup() {
      const db = await createTestDatabase('repeat_migrate', { migrate: false });
      extraDbs.push(db);
      return { args: ['migrate'], env: { DATABASE_URL: db.url }, scope: { db } };
    },
    async fingerprint({ db }) {
      const names = await sql<{ name: string }>`SELECT name FROM cairn_migration ORDER BY name`.execute(
        db.db,
      );
      const tables = await sql<{ t: string }>`
        SELECT table_name AS t FROM information_schema.tables WHERE table_schema = 'cairn' ORDER BY 1`.execute(
        db.db,
      );
      const seeded = await sql<{ n: number }>`SELECT count(*)::int AS n FROM task_transition`.execute(db.db);
      return {
        migrations: names.rows.map((r) => r.name),
        tables: tables.rows.map((r) => r.t),
        transitions: seeded.rows[0]!.n,
      };
    },
    first: { code: 0, out: /ran 0001_task_state/ },
    second: { code: 0, out: /^schema cairn is up to date; no migration ran\n$/ },
    // kysely creates its lock table first, then runs every migration in one transaction.
    killPoint: async ({ db }) =>
      (await sql<{ r: string | null }>`SELECT to_regclass('cairn_migration_lock')::text AS r`.execute(db.db))
        .rows[0]!.r !== null,
  }),

  row<{ topic: string; messageId: string }>({
    command: 'outbox release',
    async setup() {
      const topic = uniqueTopic('operator-repeats');
      const [messageId] = await t.db
        .transaction()
        .execute((trx) => createOutbox({}).enqueue(trx, [{ topic, key: 'k', payload: { n: 1 } }]));
      await sql`INSERT INTO outbox_parked_key (tenant, topic, key, message_id, error)
                VALUES ('', ${topic}, 'k', ${messageId}, 'broker refused: MESSAGE_TOO_LARGE')`.execute(t.db);
      return {
        args: ['outbox', 'release', 'k', '--topic', topic, '--reason', 'broker limit raised'],
        scope: { topic, messageId: messageId! },
      };
    },
    async fingerprint({ topic }) {
      const parked = await t.db
        .selectFrom('outbox_parked_key')
        .select('key')
        .where('topic', '=', topic)
        .execute();
      const outbox = await t.db.selectFrom('outbox').select('key').where('topic', '=', topic).execute();
      const audit = await t.db
        .selectFrom('outbox_operator_audit')
        .select(['action', 'key', 'actor', 'reason'])
        .where('topic', '=', topic)
        .execute();
      return { parked, outbox, audit };
    },
    first: { code: 0, out: /^released cairn-test\.operator-repeats\..*\/k\n$/ },
    second: { code: 1, err: /\[not_found\] parked key cairn-test\.operator-repeats\.\w+\/k does not exist/ },
  }),

  row<{ messageId: string }>({
    command: 'outbox skip',
    async setup() {
      const topic = uniqueTopic('operator-repeats');
      const [messageId] = await t.db
        .transaction()
        .execute((trx) => createOutbox({}).enqueue(trx, [{ topic, key: 'k', payload: { n: 1 } }]));
      return { args: ['outbox', 'skip', messageId!, '--reason', 'poison'], scope: { messageId: messageId! } };
    },
    async fingerprint({ messageId }) {
      const outbox = await t.db
        .selectFrom('outbox')
        .select('key')
        .where('message_id', '=', messageId)
        .execute();
      const audit = await t.db
        .selectFrom('outbox_operator_audit')
        .select(['action', 'key', 'actor', 'reason'])
        .where('message_id', '=', messageId)
        .execute();
      return { outbox, audit };
    },
    first: { code: 0, out: /^skipped [0-9a-f-]{36}\n$/ },
    second: { code: 1, err: /\[not_found\] outbox message [0-9a-f-]{36} does not exist/ },
  }),

  row<{ messageId: string; topic: string; group: string; admin: Admin; ends: number[] }>({
    command: 'inbox replay',
    async setup() {
      const { topic, group, admin } = inbox ?? (await startInboxConsumer());
      const messageId = randomUUID();
      const producer = kafkaClient(kafkaBrokers(), 'operator-repeats-producer').producer({
        createPartitioner: Partitioners.DefaultPartitioner,
      });
      await producer.connect();
      await producer.send({
        topic,
        acks: -1,
        messages: [{ key: messageId, value: '{"poison":true}', headers: { 'cairn-message-id': messageId } }],
      });
      await producer.disconnect();
      await waitFor(
        `${messageId} to be dead-lettered`,
        async () =>
          (await t.db.selectFrom('inbox_dlq').select('id').where('message_id', '=', messageId).execute())
            .length > 0,
        30_000,
      );
      await sql`INSERT INTO repeat_fixed (message_id) VALUES (${messageId})`.execute(t.db);
      return {
        args: ['inbox', 'replay', messageId, '--group', group],
        scope: { messageId, topic, group, admin, ends: [] },
      };
    },
    async settle({ messageId, topic, group, admin, ends }) {
      await waitFor(
        `${messageId} to be applied`,
        async () =>
          (await sql`SELECT 1 FROM repeat_effect WHERE message_id = ${messageId}`.execute(t.db)).rows.length >
          0,
        30_000,
      );
      // Everything on the topic consumed: a second copy would have been applied by now.
      const end = await endOffset(admin, topic);
      await waitFor(
        'the group to commit up to the end of the topic',
        async () => {
          const [c] = await admin.fetchOffsets({ groupId: group, topics: [topic] });
          return Number(c!.partitions[0]!.offset) >= end;
        },
        30_000,
      );
      ends.push(end);
    },
    async fingerprint({ messageId }) {
      const effects = await sql`SELECT 1 FROM repeat_effect WHERE message_id = ${messageId}`.execute(t.db);
      const rows = await t.db
        .selectFrom('inbox')
        .select('outcome')
        .where('message_id', '=', messageId)
        .execute();
      const dlq = await t.db
        .selectFrom('inbox_dlq')
        .select((eb) => eb('replayed_at', 'is not', null).as('replayed'))
        .where('message_id', '=', messageId)
        .execute();
      return { effects: effects.rows.length, inbox: rows, dlq };
    },
    first: { code: 0, out: /^replayed [0-9a-f-]{36} to cairn-test\.operator-repeats\.\w+ for group / },
    second: {
      code: 1,
      err: /\[already_applied\] message [0-9a-f-]{36} was already applied .* nothing was sent/,
    },
    // The dead letter is marked replayed and committed before the message is published.
    killPoint: async ({ messageId }) =>
      (
        await t.db
          .selectFrom('inbox_dlq')
          .select('id')
          .where('message_id', '=', messageId)
          .where('replayed_at', 'is not', null)
          .execute()
      ).length > 0,
    twice({ ends }) {
      // The refused second run sent nothing: the topic ends where it ended after the first.
      if (ends[1] !== ends[0])
        throw new Error(`the topic grew from ${ends[0]} to ${ends[1]} on the second replay`);
    },
  }),

  row<{ group: string }>({
    command: 'inbox prune',
    async setup() {
      const group = `repeat-prune-${suffix()}`;
      for (const [id, hoursAgo] of [
        ['old-1', 3],
        ['old-2', 2],
        ['recent', 0],
      ] as const) {
        await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", applied_at)
                  VALUES (${group}, ${id}, 'repeat-prune', 0, 1, now() - make_interval(hours => ${hoursAgo}))`.execute(
          t.db,
        );
      }
      return { args: ['inbox', 'prune', '--older-than-hours', '1'], scope: { group } };
    },
    async fingerprint({ group }) {
      return t.db
        .selectFrom('inbox')
        .select(['message_id', 'outcome'])
        .where('consumer_group', '=', group)
        .orderBy('message_id')
        .execute();
    },
    first: { code: 0, out: /^pruned [2-9]\d* inbox row\(s\) older than 1 h\n$/ },
    // Nothing else in this file writes inbox rows older than an hour.
    second: { code: 0, out: /^pruned 0 inbox row\(s\) older than 1 h\n$/ },
  }),

  row<{ taskId: string }>({
    command: 'resume',
    async setup() {
      const taskId = await task();
      return {
        args: [
          'resume',
          taskId,
          '--workflow',
          join(dir, 'wf.json'),
          '--policy',
          join(dir, 'policy.json'),
          '--agent',
          'ops',
        ],
        scope: { taskId },
      };
    },
    async fingerprint({ taskId }) {
      const s = (await store.get(taskId))!;
      const audit = (await store.history(taskId)).map((h) => ({
        v: h.version,
        actor: h.actor,
        reason: h.reason,
      }));
      const lease = await sql<{ holder: string | null; live: boolean }>`
        SELECT holder, expires_at > now() AS live FROM task_lease WHERE task_id = ${taskId}`.execute(t.db);
      return {
        version: s.version,
        status: s.status,
        committed: s.budget.currency_committed_usd,
        audit,
        lease: lease.rows,
      };
    },
    first: { code: 0, out: /: resumed from checkpoint .* at v3 implementing\n/ },
    // The first run still holds the lease (30 s): the operator is told who holds it, nothing is written.
    second: {
      code: 1,
      err: /\[lease_held\] task rep-task-\w+ \(a live worker still runs it\) is held by ops until /,
    },
    // The lease is the first thing resume writes; the budget re-reservation comes after.
    killPoint: async ({ taskId }) =>
      (await sql`SELECT 1 FROM task_lease WHERE task_id = ${taskId} AND holder = 'ops'`.execute(t.db)).rows
        .length > 0,
    // A killed resume leaves its lease until its TTL (30 s): moved to now rather than waited for.
    async afterKill({ taskId }) {
      await sql`UPDATE task_lease SET expires_at = now() WHERE task_id = ${taskId}`.execute(t.db);
    },
  }),

  row<{ taskId: string }>({
    command: 'failover release',
    async setup() {
      const taskId = await task();
      await quarantine(t.db, [taskId], { reason: 'failover check: lost work', actor: OPERATOR });
      return { args: ['failover', 'release', taskId], scope: { taskId } };
    },
    async fingerprint({ taskId }) {
      return t.db
        .selectFrom('task_quarantine')
        .select((eb) => ['reason', 'released_by', eb('released_at', 'is not', null).as('released')])
        .where('task_id', '=', taskId)
        .execute();
    },
    first: { code: 0, out: /^rep-task-\w+: released\n$/ },
    second: { code: 1, out: /^rep-task-\w+: not quarantined\n$/ },
  }),
];

beforeAll(() => setUp('operator_repeats'));
afterAll(() => tearDown());
runCases(cases);
