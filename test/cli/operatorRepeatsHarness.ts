import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildSync } from 'esbuild';
import type { Admin } from 'kafkajs';
import { sql } from 'kysely';
import { describe, it } from 'vitest';
import { repoRoot, stackDir } from '../../cli/stack/paths.js';
import { createInboxConsumer, type InboxConsumer } from '../../consumers/inboxConsumer.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { writeKeyring } from '../../src/crypto/keyProvider.js';
import type { Db } from '../../src/db/database.js';
import { registerTenant } from '../../src/db/tenant.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { workflowDigestOf } from '../../src/recovery/resume.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';

/** The harness of the operator-repeats tests (operatorRepeats.int, operatorRepeatsKeys.int: see the first's doc comment). */
export const WORKFLOW = { name: 'ship-feature', steps: ['plan', 'implement', 'review', 'test', 'deploy'] };
export const OPERATOR = `spiffe://cairn.local/operator/${process.env.USER ?? 'unknown'}`;

export let t: TestDatabase;
export let store: TaskStore;
export let dir: string;
export let keyring: string; // the KEK file of the shared database (never rotated)
export let bundle: string;
export const extraDbs: TestDatabase[] = [];
export const seen: string[] = [];

// ---- the CLI as a child process ------------------------------------------------------------

export const suffix = () => randomBytes(3).toString('hex');

export interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  out: string;
  err: string;
}
export interface Started {
  proc: ChildProcess;
  done: Promise<Run>;
}

export function start(args: readonly string[], env: Record<string, string> = {}): Started {
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

export const cairn = (args: readonly string[], env?: Record<string, string>) => start(args, env).done;

/**
 * Starts the command and SIGKILLs it as soon as `point()` holds (polled every 10 ms). Without
 * a point, it is killed 0-20 ms after its database session appears (found by a unique
 * application_name): the command is then one short transaction, and this lands before, in
 * or after it. The run may finish first: that is reported.
 */
export async function startAndKill(
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

export async function tenant(db: Db = t.db): Promise<string> {
  const id = `rep-${suffix()}`;
  await registerTenant(db, id);
  return id;
}

export async function task(
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

export interface Setup<S> {
  args: string[];
  env?: Record<string, string>;
  scope: S;
}

export interface Case<S> {
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

export const row = <S>(c: Case<S>) => c as unknown as Case<unknown>;

// inbox replay: a consumer of its own that dead-letters a poison message until it is "fixed"
export let inbox: { topic: string; group: string; consumer: InboxConsumer; admin: Admin } | undefined;

export async function startInboxConsumer() {
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

export async function endOffset(admin: Admin, topic: string): Promise<number> {
  const [p] = await admin.fetchTopicOffsets(topic);
  return Number(p!.high);
}

let rewrap: { db: TestDatabase; file: string } | undefined;

/** `keys rewrap`'s database of its own (rewrap touches every data key there, and needs every KEK they are under). */
export async function rewrapDatabase(): Promise<{ db: TestDatabase; file: string }> {
  if (!rewrap) {
    const db = await createTestDatabase('repeat_rewrap');
    extraDbs.push(db);
    const file = join(mkdtempSync(join(tmpdir(), 'cairn-repeat-rewrap-')), 'keyring.json');
    writeKeyring(file);
    rewrap = { db, file };
  }
  return rewrap;
}

export async function setUp(label: string): Promise<void> {
  t = await createTestDatabase(label);
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
}

export async function tearDown(): Promise<void> {
  if (seen.length) console.info(`operator repeats, killed runs:\n  ${seen.join('\n  ')}`);
  await inbox?.consumer.stop();
  await inbox?.admin.disconnect();
  for (const db of extraDbs) await db.drop();
  await t?.drop();
}

const describeRun = (r: Run) =>
  r.signal
    ? `killed (${r.signal})${r.out ? ` after printing ${JSON.stringify(r.out.trim())}` : ''}`
    : `finished first (exit ${r.code})`;

/** Each case run twice on one setup, and SIGKILLed and run again on another (the file's doc comment). */
export function runCases(cases: ReadonlyArray<Case<unknown>>): void {
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
}
