/**
 * Issue 14, "Operators repeat themselves": every `cairn` command that changes data, run a
 * second time, or SIGKILLed inside its work and then run again, leaves the rows one run
 * leaves. One table row per command: how to set up what it acts on, its arguments, and a
 * fingerprint of the rows it concerns (timestamps and generated ids normalized away).
 *
 * For each command, on one setup: run it once, fingerprint; run it again, the fingerprint is
 * unchanged and the second run exits as the table says. On a second setup: start it, SIGKILL
 * it (at a named point inside its work where there is one to wait for, otherwise after a
 * short random delay: those commands are one short transaction, too fast to interrupt
 * anywhere but around it), run it again to completion: the fingerprint is the first one.
 *
 * Commands that change data and are not here: `relay` (a long-running process, killed in
 * test/chaos), `stack up|down` (starts and stops the shared services), `state upgrade` and
 * `failover check --hold` (not covered yet). Read-only commands (status, parked, dlq, list,
 * certificates, task, checkpoint) change nothing.
 *
 * "Same result" where a command adds by nature:
 * - `keys rotate` adds a KEK each run: that is what it is for. The fingerprint is what must
 *   hold however often it ran (every earlier key kept byte for byte, the current one new,
 *   the file valid, no stray file); the test also states that a second run added one more.
 * - `annotate` and `hold place`: the record is append-only, so a repeated command (the
 *   operator saw no output because the first run was killed after its commit) must not leave
 *   a duplicate that can never be removed. Same result means one annotation / one active hold
 *   with that author (actor) and body (reason): an annotation's id comes from what it says,
 *   and placing an active hold again returns it ("already held").
 *
 * The CLI is bundled once with esbuild (as test/support/processes.ts bundles its children)
 * and run as `node <bundle> ...`: under `npx tsx` the work runs in a grandchild that a
 * SIGKILL to the child does not reach, and each start costs ~2.5 s of compiling.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildSync } from 'esbuild';
import { type Admin, Partitioners } from 'kafkajs';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, it } from 'vitest';
import { repoRoot, stackDir } from '../../cli/stack/paths.js';
import { createInboxConsumer, type InboxConsumer } from '../../consumers/inboxConsumer.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys, type Sealed } from '../../src/crypto/tenantKeys.js';
import type { Db } from '../../src/db/database.js';
import { registerTenant } from '../../src/db/tenant.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { quarantine } from '../../src/recovery/failover.js';
import { workflowDigestOf } from '../../src/recovery/resume.js';
import { placeHold } from '../../src/retention/holds.js';
import { certificateIntact, setRetentionPolicy } from '../../src/retention/retention.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
  uniqueTopic,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

const WORKFLOW = { name: 'ship-feature', steps: ['plan', 'implement', 'review', 'test', 'deploy'] };
const OPERATOR = `spiffe://cairn.local/operator/${process.env.USER ?? 'unknown'}`;

let t: TestDatabase;
let store: TaskStore;
let dir: string;
let keyring: string; // the KEK file of the shared database (never rotated)
let bundle: string;
const extraDbs: TestDatabase[] = [];
const seen: string[] = [];

// ---- the CLI as a child process ------------------------------------------------------------

const suffix = () => randomBytes(3).toString('hex');

interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  out: string;
  err: string;
}
interface Started {
  proc: ChildProcess;
  done: Promise<Run>;
}

function start(args: readonly string[], env: Record<string, string> = {}): Started {
  const proc = spawn(process.execPath, [bundle, ...args], {
    cwd: repoRoot,
    env: {
      ...process.env,
      DATABASE_URL: t.url,
      KAFKA_BROKERS: kafkaBrokers().join(','),
      CAIRN_KEYRING: keyring,
      CAIRN_LOG_LEVEL: 'warn',
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  proc.stdout?.on('data', (d: Buffer) => {
    out += d;
  });
  proc.stderr?.on('data', (d: Buffer) => {
    err += d;
  });
  const done = once(proc, 'exit').then(([code, signal]) => ({
    code: code as number | null,
    signal: signal as NodeJS.Signals | null,
    out,
    err,
  }));
  return { proc, done };
}

const cairn = (args: readonly string[], env?: Record<string, string>) => start(args, env).done;

/**
 * Starts the command and SIGKILLs it as soon as `point()` holds (polled every 10 ms). Without
 * a point, it is killed 0-20 ms after its database session appears (found by a unique
 * application_name): the command is then one short transaction, and this lands before, in
 * or after it. The run may finish first: that is reported.
 */
async function startAndKill(
  args: readonly string[],
  env: Record<string, string> | undefined,
  point: (() => Promise<boolean>) | undefined,
): Promise<Run> {
  const name = `cairn-repeat-${suffix()}`;
  const url = new URL(env?.DATABASE_URL ?? t.url);
  url.searchParams.set('application_name', name);
  const child = start(args, { ...env, DATABASE_URL: url.toString() });
  let exited = false;
  void child.done.then(() => {
    exited = true;
  });
  const connected = async () =>
    (await sql`SELECT 1 FROM pg_stat_activity WHERE application_name = ${name}`.execute(t.db)).rows.length >
    0;
  const until = Date.now() + 30_000;
  while (!exited && Date.now() < until && !(await (point ?? connected)())) {
    await new Promise((r) => setTimeout(r, 10));
  }
  if (!point) await new Promise((r) => setTimeout(r, Math.floor(Math.random() * 20)));
  if (!exited) child.proc.kill('SIGKILL');
  return child.done;
}

// ---- fixtures ------------------------------------------------------------------------------

async function tenant(db: Db = t.db): Promise<string> {
  const id = `rep-${suffix()}`;
  await registerTenant(db, id);
  return id;
}

async function task(
  tenantId = 'acme',
  status: 'implementing' | 'cancelled' = 'implementing',
): Promise<string> {
  const id = `rep-task-${suffix()}`;
  await store.create({
    task: newTask(id, { tenant_id: tenantId, workflow_digest: workflowDigestOf(WORKFLOW) }),
    actor: AGENT,
  });
  const r = await store.update({
    taskId: id,
    expectedVersion: 1,
    patch: status === 'implementing' ? { status, gates: { plan_approved: true } } : { status },
    actor: AGENT,
    reason: 'set up for the operator-repeats test',
  });
  if (!r.ok) throw r.error;
  return id;
}

// ---- the table -----------------------------------------------------------------------------

interface Setup<S> {
  args: string[];
  env?: Record<string, string>;
  scope: S;
}

interface Case<S> {
  command: string;
  setup(): Promise<Setup<S>>;
  /** The rows the command concerns, with timestamps and generated ids normalized away. */
  fingerprint(scope: S): Promise<unknown>;
  first: { code: number; out?: RegExp };
  /** How the second run on the same setup ends; undefined code: not asserted (see the table). */
  second: { code?: number; out?: RegExp; err?: RegExp };
  /** Waits until what the command set in motion has settled (a consumer applied a message). */
  settle?(scope: S): Promise<void>;
  /** A condition inside the command's work at which the child is SIGKILLed. */
  killPoint?(scope: S): Promise<boolean>;
  /** After the kill, before the run to completion (e.g. the killed run's lease expires). */
  afterKill?(scope: S): Promise<void>;
  /** Further checks on the two runs of the same setup. */
  twice?(scope: S, first: Run, second: Run): Promise<void> | void;
}

const row = <S>(c: Case<S>) => c as unknown as Case<unknown>;

// inbox replay: a consumer of its own that dead-letters a poison message until it is "fixed"
let inbox: { topic: string; group: string; consumer: InboxConsumer; admin: Admin } | undefined;

async function startInboxConsumer() {
  const topic = await createTestTopic('operator-repeats', 1);
  const group = `${topic}.g`;
  await sql`CREATE TABLE repeat_effect (message_id text NOT NULL)`.execute(t.db);
  await sql`CREATE TABLE repeat_fixed (message_id text PRIMARY KEY)`.execute(t.db);
  const consumer = createInboxConsumer({
    db: t.db,
    groupId: group,
    subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId: group, topics: [topic] }),
    dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
    handler: async (trx, m) => {
      const fixed = await sql`SELECT 1 FROM repeat_fixed WHERE message_id = ${m.messageId}`.execute(trx);
      if (fixed.rows.length === 0)
        throw Object.assign(new Error(`${m.messageId} is malformed`), { retriable: false });
      await sql`INSERT INTO repeat_effect (message_id) VALUES (${m.messageId})`.execute(trx);
    },
    maxAttempts: 1,
    retryBaseMs: 10,
  });
  void consumer.run();
  const admin = kafkaClient(kafkaBrokers(), 'operator-repeats-admin').admin();
  await admin.connect();
  inbox = { topic, group, consumer, admin };
  return inbox;
}

async function endOffset(admin: Admin, topic: string): Promise<number> {
  const [p] = await admin.fetchTopicOffsets(topic);
  return Number(p!.high);
}

let rewrap: { db: TestDatabase; file: string } | undefined;

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

  row<{ tenant: string }>({
    command: 'tenant add',
    async setup() {
      const id = `rep-${suffix()}`;
      return { args: ['tenant', 'add', id], scope: { tenant: id } };
    },
    async fingerprint({ tenant: id }) {
      const tenants = await t.db
        .selectFrom('tenant')
        .select('tenant_id')
        .where('tenant_id', '=', id)
        .execute();
      const keys = await t.db.selectFrom('tenant_key').select('kek_id').where('tenant_id', '=', id).execute();
      return { tenants: tenants.length, keys };
    },
    first: { code: 0, out: /: registered, data key dk-/ },
    second: { code: 0, out: /: already registered, data key dk-/ },
    twice(_s, first, second) {
      const key = (r: Run) => /data key (dk-\S+)/.exec(r.out)?.[1];
      if (key(first) !== key(second)) throw new Error(`a second data key: ${key(first)} then ${key(second)}`);
    },
  }),

  row<{ tenant: string }>({
    command: 'tenant shred',
    async setup() {
      const id = `rep-${suffix()}`;
      await createTenantKeys({ db: t.db, provider: localKeyring(keyring) }).addTenant(id);
      return { args: ['tenant', 'shred', id, '--yes'], scope: { tenant: id } };
    },
    async fingerprint({ tenant: id }) {
      const tenants = await t.db
        .selectFrom('tenant')
        .select('tenant_id')
        .where('tenant_id', '=', id)
        .execute();
      const keys = await t.db.selectFrom('tenant_key').select('kek_id').where('tenant_id', '=', id).execute();
      return { tenants: tenants.length, keys };
    },
    first: { code: 0, out: /^rep-\w+: 1 data key\(s\) destroyed\n$/ },
    second: { code: 0, out: /^rep-\w+: 0 data key\(s\) destroyed\n$/ },
  }),

  row<{ dir: string; file: string }>({
    command: 'keys init',
    async setup() {
      const d = mkdtempSync(join(tmpdir(), 'cairn-repeat-init-'));
      return {
        args: ['keys', 'init', '--file', join(d, 'keyring.json')],
        scope: { dir: d, file: join(d, 'keyring.json') },
      };
    },
    async fingerprint({ dir: d, file }) {
      const k = JSON.parse(readFileSync(file, 'utf8')) as { current: string; keys: Record<string, string> };
      await localKeyring(file).currentKekId(); // valid, and mode 600
      return { files: readdirSync(d), keys: Object.keys(k.keys).length, currentPresent: k.current in k.keys };
    },
    first: { code: 0, out: /: current key-encryption key kek-/ },
    second: { code: 1, err: /keyring.json/ },
  }),

  row<{ dir: string; file: string; before: Record<string, string> }>({
    command: 'keys rotate',
    async setup() {
      const d = mkdtempSync(join(tmpdir(), 'cairn-repeat-rotate-'));
      const file = join(d, 'keyring.json');
      writeKeyring(file);
      const before = (JSON.parse(readFileSync(file, 'utf8')) as { keys: Record<string, string> }).keys;
      return { args: ['keys', 'rotate', '--file', file], scope: { dir: d, file, before } };
    },
    async fingerprint({ dir: d, file, before }) {
      const k = JSON.parse(readFileSync(file, 'utf8')) as { current: string; keys: Record<string, string> };
      await localKeyring(file).currentKekId();
      return {
        files: readdirSync(d),
        earlierKeysKept: Object.entries(before).every(([id, v]) => k.keys[id] === v),
        currentIsNew: k.current in k.keys && !(k.current in before),
      };
    },
    first: { code: 0, out: /: current key-encryption key kek-/ },
    second: { code: 0, out: /: current key-encryption key kek-/ },
    // A keyring write is synchronous and quick: the random delay mostly lands before or after it.
    twice({ file, before }) {
      const n = Object.keys((JSON.parse(readFileSync(file, 'utf8')) as { keys: object }).keys).length;
      if (n !== Object.keys(before).length + 2)
        throw new Error(`expected one more KEK per rotate, found ${n}`);
    },
  }),

  row<{ tenant: string; sealed: Sealed }>({
    command: 'keys rewrap',
    // A database of its own: rewrap touches every data key there, and needs every KEK they are under.
    async setup() {
      if (!rewrap) {
        const db = await createTestDatabase('repeat_rewrap');
        extraDbs.push(db);
        const file = join(mkdtempSync(join(tmpdir(), 'cairn-repeat-rewrap-')), 'keyring.json');
        writeKeyring(file);
        rewrap = { db, file };
      }
      const { db, file } = rewrap;
      const id = await tenant(db.db);
      const keys = createTenantKeys({ db: db.db, provider: localKeyring(file) });
      await keys.addTenant(id);
      const sealed = await keys.seal(id, Buffer.from('plaintext'), 'aad');
      writeKeyring(file, { rotate: true });
      return {
        args: ['keys', 'rewrap', '--keyring', file],
        env: { DATABASE_URL: db.url },
        scope: { tenant: id, sealed },
      };
    },
    async fingerprint({ tenant: id, sealed }) {
      const { db, file } = rewrap!;
      const provider = localKeyring(file);
      const rows = await db.db
        .selectFrom('tenant_key')
        .select('kek_id')
        .where('tenant_id', '=', id)
        .execute();
      const opened = await createTenantKeys({ db: db.db, provider }).open(
        id,
        sealed.keyId,
        sealed.bytes,
        'aad',
      );
      return {
        underCurrentKek: rows.map((r) => r.kek_id === JSON.parse(readFileSync(file, 'utf8')).current),
        opens: opened.toString(),
      };
    },
    first: { code: 0, out: /^rewrapped 1 data key\(s\) under kek-/ },
    second: { code: 0, out: /^rewrapped 0 data key\(s\) under kek-/ },
  }),

  row<{ tenant: string }>({
    command: 'retention policy',
    async setup() {
      const id = await tenant();
      return {
        args: ['retention', 'policy', '--tenant', id, '--class', 'internal', '--days', '7'],
        scope: { tenant: id },
      };
    },
    async fingerprint({ tenant: id }) {
      return t.db
        .selectFrom('retention_policy')
        .select(['data_class', 'retain_days'])
        .where('tenant_id', '=', id)
        .execute();
    },
    first: { code: 0, out: /: internal data kept 7 day\(s\) after a task ends\n$/ },
    second: { code: 0, out: /: internal data kept 7 day\(s\) after a task ends\n$/ },
  }),

  row<{ tenant: string; tasks: string[] }>({
    command: 'retention run',
    async setup() {
      const id = await tenant();
      await setRetentionPolicy(t.db, { tenantId: id, dataClass: 'internal', retainDays: 0 });
      const tasks = [await task(id, 'cancelled'), await task(id, 'cancelled'), await task(id, 'cancelled')];
      return { args: ['retention', 'run', '--tenant', id, '--batch', '1'], scope: { tenant: id, tasks } };
    },
    async fingerprint({ tenant: id, tasks }) {
      const remaining = await t.db
        .selectFrom('task_state')
        .select('task_id')
        .where('tenant_id', '=', id)
        .execute();
      const audit = await t.db
        .selectFrom('task_audit')
        .select('version')
        .where('task_id', 'in', tasks)
        .execute();
      const certs = await t.db
        .selectFrom('deletion_certificate')
        .selectAll()
        .where('tenant_id', '=', id)
        .execute();
      const covered = certs
        .flatMap((c) => (c.body.tasks as Array<{ task_id: string }>).map((x) => tasks.indexOf(x.task_id)))
        .sort();
      return {
        remaining: remaining.length,
        audit: audit.length,
        certificates: certs.length,
        covered,
        intact: certs.every(certificateIntact),
      };
    },
    first: {
      code: 0,
      out: /^deleted 3 task\(s\); 0 expired but held; run [0-9a-f-]{36}, 3 certificate\(s\)/,
    },
    second: {
      code: 0,
      out: /^deleted 0 task\(s\); 0 expired but held; run [0-9a-f-]{36}, 0 certificate\(s\)/,
    },
    // One batch, one transaction, one certificate per task (--batch 1): killed after the first.
    killPoint: async ({ tenant: id }) =>
      (await t.db.selectFrom('deletion_certificate').select('run_id').where('tenant_id', '=', id).execute())
        .length > 0,
  }),

  row<{ taskId: string }>({
    command: 'hold place',
    async setup() {
      const taskId = await task(await tenant());
      return {
        args: ['hold', 'place', '--task', taskId, '--reason', 'litigation 2026-17'],
        scope: { taskId },
      };
    },
    async fingerprint({ taskId }) {
      return t.db
        .selectFrom('legal_hold')
        .select(['reason', 'placed_by'])
        .where('task_id', '=', taskId)
        .where('released_at', 'is', null)
        .execute();
    },
    first: { code: 0, out: /^hold [0-9a-f-]{36} on task rep-task-\w+: litigation 2026-17\n$/ },
    second: { code: 0, out: /^already held: [0-9a-f-]{36} on task rep-task-\w+: litigation 2026-17\n$/ },
  }),

  row<{ taskId: string }>({
    command: 'hold release',
    async setup() {
      const taskId = await task(await tenant());
      await placeHold(t.db, { taskId, reason: 'litigation 2026-17', actor: OPERATOR });
      return { args: ['hold', 'release', '--task', taskId], scope: { taskId } };
    },
    async fingerprint({ taskId }) {
      return t.db
        .selectFrom('legal_hold')
        .select((eb) => ['reason', 'released_by', eb('released_at', 'is not', null).as('released')])
        .where('task_id', '=', taskId)
        .execute();
    },
    first: { code: 0, out: /^released 1 hold\(s\)\n$/ },
    second: { code: 0, out: /^released 0 hold\(s\)\n$/ },
  }),

  row<{ taskId: string }>({
    command: 'annotate',
    async setup() {
      const taskId = await task();
      return {
        args: ['annotate', taskId, '--body', 'plan approved by phone, see ticket OPS-88'],
        scope: { taskId },
      };
    },
    async fingerprint({ taskId }) {
      return t.db
        .selectFrom('task_annotation')
        .select(['author', 'body'])
        .where('task_id', '=', taskId)
        .execute();
    },
    first: { code: 0, out: /^annotation [0-9a-f-]{36} added to rep-task-\w+\n$/ },
    second: { code: 0, out: /^annotation [0-9a-f-]{36} added to rep-task-\w+\n$/ },
  }),
];

beforeAll(async () => {
  t = await createTestDatabase('operator_repeats');
  store = createTaskStore({ db: t.db, checkpointer: createCheckpointer({ db: t.db }) });
  await registerTenant(t.db, 'acme');
  dir = mkdtempSync(join(tmpdir(), 'cairn-repeats-'));
  keyring = join(dir, 'keyring.json');
  writeKeyring(keyring);
  writeFileSync(join(dir, 'wf.json'), JSON.stringify(WORKFLOW));
  // Below the task's 100 USD committed: resume re-reserves, a write under its lease.
  writeFileSync(
    join(dir, 'policy.json'),
    JSON.stringify({ version: 'policy-repeat', allowed: true, budgetLimitUsd: 50 }),
  );
  mkdirSync(join(stackDir, 'bundles'), { recursive: true });
  bundle = join(stackDir, 'bundles', `cairn_cli.operatorRepeats.${process.pid}.mjs`);
  buildSync({
    entryPoints: [join(repoRoot, 'cli/main.ts')],
    outfile: bundle,
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    packages: 'external',
    logLevel: 'error',
  });
});

afterAll(async () => {
  if (seen.length) console.info(`operator repeats, killed runs:\n  ${seen.join('\n  ')}`);
  await inbox?.consumer.stop();
  await inbox?.admin.disconnect();
  for (const db of extraDbs) await db.drop();
  await t?.drop();
});

const describeRun = (r: Run) =>
  r.signal
    ? `killed (${r.signal})${r.out ? ` after printing ${JSON.stringify(r.out.trim())}` : ''}`
    : `finished first (exit ${r.code})`;

describe.concurrent('a cairn command run twice, or SIGKILLed and run again, leaves the rows one run leaves', () => {
  for (const c of cases) {
    it(`cairn ${c.command}`, async ({ expect }) => {
      const run = (s: Setup<unknown>) => cairn(s.args, s.env);

      // Run once, then again on the same setup.
      const a = await c.setup();
      const r1 = await run(a);
      expect({ code: r1.code, err: r1.err }).toMatchObject({ code: c.first.code });
      if (c.first.out) expect(r1.out).toMatch(c.first.out);
      await c.settle?.(a.scope);
      const once = await c.fingerprint(a.scope);

      const r2 = await run(a);
      if (c.second.code !== undefined)
        expect({ code: r2.code, err: r2.err }).toMatchObject({ code: c.second.code });
      if (c.second.out) expect(r2.out).toMatch(c.second.out);
      if (c.second.err) expect(r2.err).toMatch(c.second.err);
      await c.settle?.(a.scope);
      expect.soft(await c.fingerprint(a.scope), 'run twice').toEqual(once);
      await c.twice?.(a.scope, r1, r2);

      // SIGKILLed inside its work, then run again to completion.
      const k = await c.setup();
      const killed = await startAndKill(k.args, k.env, c.killPoint && (() => c.killPoint!(k.scope)));
      // What the killed run left (for the report): its work whole, or not (then maybe nothing to read).
      const left = await c.fingerprint(k.scope).catch(() => undefined);
      const done = JSON.stringify(left) === JSON.stringify(once);
      seen.push(`${c.command}: ${describeRun(killed)}; its work ${done ? 'had' : 'had not'} all committed`);
      await c.afterKill?.(k.scope);
      const again = await run(k);
      expect([c.first.code, c.second.code]).toContain(again.code);
      await c.settle?.(k.scope);
      expect(await c.fingerprint(k.scope), 'killed, then run again').toEqual(once);
      seen.push(
        `${c.command}: run again after the kill: exit ${again.code} ${JSON.stringify((again.out + again.err).trim().slice(0, 120))}`,
      );
    });
  }
});
