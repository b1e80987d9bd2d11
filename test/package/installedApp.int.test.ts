import { execFile } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { createScratchDatabase, type ScratchDatabase } from '../../scripts/lib/scratchDatabase.js';
import { createTestTopic, kafkaBrokers } from '../support/testDatabase.js';
import { packTarball, type Tarball } from './packTarball.js';

const run = promisify(execFile);
const pkg = JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as {
  name: string;
  version: string;
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
};

/**
 * A user's app: imports Cairn by its package name only, compiled with tsc --strict and
 * skipLibCheck: false, run by plain node. The flow: migrate, create a task, a CAS update with
 * a message, the relay until it is published, an inbox consumer whose handler writes the
 * app's own table in the handler's transaction, a lease, a receipt, checkpoint verify.
 */
const app = `
import { createRequire } from 'node:module';
import { sql } from 'kysely';
import {
  CairnError,
  createCheckpointer,
  createDb,
  createLeaseManager,
  createReceiptStore,
  createTaskStore,
  HEADER,
  migrateToLatest,
} from '${pkg.name}';
import { createKafkaPublisher, createRelay } from '${pkg.name}/relay';
import { createInboxConsumer, createKafkaSubscriber, type InboxMessage } from '${pkg.name}/inbox';

type Parser = (value: string) => unknown;
const pgTypes = (createRequire(import.meta.url)('pg') as { types: { getTypeParser(oid: number): Parser } }).types;
const int8Before = pgTypes.getTypeParser(20);

const env = (name: string): string => {
  const v = process.env[name];
  if (!v) throw new Error(name + ' is not set');
  return v;
};
const topic = env('APP_TOPIC');
const brokers = env('KAFKA_BROKERS').split(',');
const actor = 'spiffe://app.example/agents/planner';
const report: Record<string, unknown> = {};

async function until<T>(what: string, probe: () => Promise<T | undefined>, ms = 60_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error('timed out waiting for ' + what);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const db = createDb({ connectionString: env('DATABASE_URL') });
report.migrations = (await migrateToLatest(db)).length;
// The app's own table, in public beside Cairn's schema (Cairn's connections search cairn, then public).
await sql\`CREATE TABLE public.orders (id text PRIMARY KEY, task_id text NOT NULL, task_version int NOT NULL)\`.execute(db);
type AppTables = { orders: { id: string; task_id: string; task_version: number } };

const checkpointer = createCheckpointer({ db });
const tasks = createTaskStore({ db, checkpointer });
const created = await tasks.create({
  task: { tenant_id: 'acme', task_id: 'APP-1', workflow_digest: 'sha256:' + '0'.repeat(64), intent_id: 'I-1' },
  actor,
});
const updated = await tasks.update({
  taskId: 'APP-1',
  expectedVersion: created.version,
  patch: { status: 'implementing', gates: { plan_approved: true } },
  actor,
  reason: 'plan approved',
  messages: [{ topic, key: 'APP-1', payload: { order: 'O-1' } }],
});
if (!updated.ok) throw updated.error;
const stale = await tasks.update({ taskId: 'APP-1', expectedVersion: 1, patch: { gates: { tests_passing: true } }, actor });
report.version = updated.state.version;
report.staleRefused = !stale.ok && stale.error instanceof CairnError && stale.error.code;

const relay = createRelay({ db, publisher: createKafkaPublisher({ brokers }) });
const relayRun = relay.run();
report.published = await until('the relay to publish', async () => relay.stats().published || undefined);

const groupId = 'app-' + topic;
const consumer = createInboxConsumer<AppTables>({
  db,
  groupId,
  subscriber: createKafkaSubscriber({ brokers, groupId, topics: [topic], fromBeginning: true }),
  dlqPublisher: createKafkaPublisher({ brokers }),
  async handler(trx, m: InboxMessage) {
    const body = m.json<{ order: string }>();
    // Typed: a misspelt column or table would not compile under tsc --strict.
    await trx
      .insertInto('orders')
      .values({ id: body.order, task_id: m.headers[HEADER.taskId] ?? '', task_version: m.taskVersion ?? 0 })
      .execute();
  },
});
void consumer.run();
report.order = await until('the handler to write the order', async () =>
  (await sql<{ id: string; task_id: string; task_version: number }>\`SELECT * FROM public.orders\`.execute(db)).rows[0],
);
report.inboxRows = Number((await db.selectFrom('inbox').select((eb) => eb.fn.countAll().as('n')).executeTakeFirstOrThrow()).n);

const leases = createLeaseManager({ db });
const lease = await leases.acquire({ taskId: 'APP-1', branch: 'main', agentId: 'agent-1', ttlMs: 30_000 });
if (!lease.ok) throw new Error('lease held by ' + lease.holder);
report.fencingToken = lease.fencingToken;

const receipts = createReceiptStore({ db });
let effects = 0;
const deploy = () =>
  receipts.runOnce({
    taskId: 'APP-1',
    step: 'deploy',
    tool: 'deployer',
    args: { build: 7 },
    onUncertain: 'gate',
    lease,
    effect: async () => {
      effects++;
      return { deployed: true };
    },
  });
const first = await deploy();
const second = await deploy();
report.receipts = {
  first: first.status,
  second: second.status,
  secondRan: second.status === 'succeeded' && second.ran,
  effects,
};
await leases.release(lease);

const checkpoints = await checkpointer.list('APP-1');
const newest = checkpoints[0];
if (!newest) throw new Error('no checkpoint');
const verification = await checkpointer.verify(newest, checkpoints[1]);
report.checkpoints = checkpoints.length;
report.checkpointVerified = verification.ok;

report.pgGlobalsUnchanged = pgTypes.getTypeParser(20) === int8Before;
await consumer.stop();
await relay.stop();
await relayRun;
await db.destroy();
console.log(JSON.stringify(report));
`;

const tsconfig = {
  compilerOptions: {
    target: 'ES2022',
    module: 'NodeNext',
    moduleResolution: 'NodeNext',
    lib: ['ES2023'],
    types: ['node'],
    strict: true,
    skipLibCheck: false,
    outDir: 'dist',
    rootDir: 'src',
  },
  include: ['src'],
};

let tarball: Tarball;
let appDir: string;
let scratch: ScratchDatabase;
const npm = (args: string[]) =>
  run('npm', args, {
    cwd: appDir,
    maxBuffer: 16 * 1024 * 1024,
    env: { ...process.env, npm_config_yes: 'true' },
  });

beforeAll(async () => {
  tarball = await packTarball();
  appDir = await mkdtemp(join(tmpdir(), 'cairn-app-'));
  await npm(['init', '-y']);
  const appPkg = JSON.parse(await readFile(join(appDir, 'package.json'), 'utf8'));
  await writeFile(join(appDir, 'package.json'), JSON.stringify({ ...appPkg, type: 'module' }, null, 2));
  // The app's own dependencies: kysely for its SQL, @types/node as any Node app in TypeScript.
  await npm([
    'install',
    '--prefer-offline',
    '--no-audit',
    '--no-fund',
    tarball.path,
    `kysely@${pkg.dependencies.kysely}`,
    `@types/node@${pkg.devDependencies['@types/node']}`,
  ]);
  mkdirSync(join(appDir, 'src'));
  await writeFile(join(appDir, 'src', 'main.ts'), app);
  await writeFile(join(appDir, 'tsconfig.json'), JSON.stringify(tsconfig, null, 2));
  scratch = await createScratchDatabase(inject('databaseUrl'), `cairn_t_installed_app_${process.pid}`, {
    recreate: true,
  });
}, 240_000);

afterAll(async () => {
  await scratch?.drop();
  if (appDir) await rm(appDir, { recursive: true, force: true });
  if (tarball) await rm(dirname(tarball.path), { recursive: true, force: true });
});

describe(`${pkg.name} installed from its tarball into an app outside the checkout`, () => {
  it('the app compiles with tsc --strict and skipLibCheck: false, importing the package by name only', async () => {
    expect(appDir.startsWith(repoRoot)).toBe(false);
    const tsc = join(repoRoot, 'node_modules', 'typescript', 'bin', 'tsc');
    const r = await run(process.execPath, [tsc, '-p', 'tsconfig.json'], { cwd: appDir }).catch(
      (e: { stdout: string; stderr: string }) => ({ stdout: e.stdout, stderr: e.stderr, failed: true }),
    );
    expect(r, `${r.stdout}${r.stderr}`).not.toHaveProperty('failed');
  });

  it('runs under plain node against real Postgres and Kafka: task, CAS, relay, inbox into a user table, lease, receipt, checkpoint', async () => {
    const topic = await createTestTopic('installed-app', 1);
    const { stdout } = await run(process.execPath, ['dist/main.js'], {
      cwd: appDir,
      env: {
        ...process.env,
        DATABASE_URL: scratch.url,
        KAFKA_BROKERS: kafkaBrokers().join(','),
        APP_TOPIC: topic,
      },
      timeout: 90_000,
    });
    const report = JSON.parse(stdout.trim().split('\n').pop()!);
    expect(report).toMatchObject({
      version: 2,
      staleRefused: 'stale_version',
      published: 1,
      order: { id: 'O-1', task_id: 'APP-1', task_version: 2 },
      inboxRows: 1,
      receipts: { first: 'succeeded', second: 'succeeded', secondRan: false, effects: 1 },
      checkpointVerified: true,
      pgGlobalsUnchanged: true,
    });
    expect(typeof report.fencingToken).toBe('number'); // int8 read as a number on Cairn's pool
    expect(report.checkpoints).toBeGreaterThanOrEqual(1);
  });

  it('npx cairn --version and a command from the install', async () => {
    const v = await npm(['exec', '--no', '--', 'cairn', '--version']);
    expect(v.stdout.trim()).toBe(`${pkg.name} ${pkg.version}`);
    const status = await run('npx', ['--no', 'cairn', 'migrate', '--status'], {
      cwd: appDir,
      env: { ...process.env, DATABASE_URL: scratch.url },
    });
    expect(status.stdout).toContain('0001_task_state');
  });
});
