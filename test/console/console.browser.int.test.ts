import { execFile } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { existsSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { type Browser, type BrowserContext, chromium } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { type RunningConsole, startConsole } from '../../console/server.js';
import { createDb, type Db } from '../../src/db/database.js';
import { registerTenant } from '../../src/db/tenant.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestTopic, kafkaBrokers } from '../support/testDatabase.js';
import { readTopic } from '../support/topicReader.js';
import { deadLetter, gatedTask, parkedKey, TOKENS, USERS } from './fixtures.js';

// The console driven in headless Chromium (Debian's package; `.ci/run` installs it), after the
// demo ran: what an operator sees and does. Screenshots go to docs/ with CAIRN_UPDATE_SCREENSHOTS=1.

const CHROMIUM = process.env.CAIRN_CHROMIUM ?? '/usr/bin/chromium';
const haveChromium = existsSync(CHROMIUM);
if (!haveChromium) {
  console.warn(
    `[console browser tests] skipped: no Chromium at ${CHROMIUM} (apt-get install chromium, or set CAIRN_CHROMIUM)`,
  );
}
const shots =
  process.env.CAIRN_UPDATE_SCREENSHOTS === '1'
    ? join(repoRoot, 'docs')
    : mkdtempSync(join(tmpdir(), 'cairn-shots-'));
const KEYS = 'console-test:a-signing-secret-for-the-browser-test';
const database = `cairn_t_console_${randomBytes(4).toString('hex')}`;

let db: Db;
let running: RunningConsole;
let browser: Browser;
let gate: { receiptId: string };
let parkedTopic: string;
let dlTopic: string;
const dlMessage = randomUUID();

async function as(user: keyof typeof TOKENS): Promise<BrowserContext> {
  return browser.newContext({ httpCredentials: { username: user, password: TOKENS[user] } });
}

describe.skipIf(!haveChromium)('cairn console in a browser', () => {
  beforeAll(async () => {
    // The demo, as a user runs it, with signed checkpoints.
    const { stdout } = await promisify(execFile)(
      'npx',
      ['tsx', 'scripts/demo.ts', '--tasks', '2', '--chaos', 'off', '--work-ms', '50', '--database', database],
      {
        cwd: repoRoot,
        env: {
          ...process.env,
          DATABASE_URL: inject('databaseUrl'),
          KAFKA_BROKERS: inject('kafkaBrokers'),
          CAIRN_CHECKPOINT_KEYS: KEYS,
        },
        timeout: 240_000,
      },
    );
    expect(stdout).toMatch(/checkpoints verify \(digest, chain, signature\) +0 corrupt +0 corrupt +ok/);
    const url = new URL(inject('databaseUrl'));
    url.pathname = `/${database}`;
    db = createDb({ connectionString: url.toString(), max: 8 });
    // What the demo does not leave behind: a gated receipt, a parked key, a dead letter, two tenants.
    for (const t of ['tenant-a', 'tenant-b']) await registerTenant(db, t);
    gate = await gatedTask(db, 'gate-a', 'tenant-a');
    await gatedTask(db, 'gate-b', 'tenant-b'); // stays gated: something to act on for the read-only user
    await createTaskStore({ db }).create({
      task: newTask('b-secret', { tenant_id: 'tenant-b' }),
      actor: AGENT,
    });
    parkedTopic = await createTestTopic('console-parked', 1);
    await parkedKey(db, parkedTopic, 'order-7', 'tenant-a');
    await parkedKey(db, parkedTopic, 'order-8', 'tenant-b'); // stays parked
    dlTopic = await createTestTopic('console-dlq', 1);
    await deadLetter(db, { groupId: 'billing', topic: dlTopic, messageId: dlMessage, tenantId: 'tenant-a' });

    const [kid, secret] = KEYS.split(':') as [string, string];
    running = await startConsole({
      db,
      users: USERS,
      port: 0,
      liveEveryMs: 500,
      checkpointKeys: { keyRing: { current: kid, keys: { [kid]: Buffer.from(secret) } } },
      publisher: () => createKafkaPublisher({ brokers: kafkaBrokers() }),
    });
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox', '--disable-gpu'] });
  });
  afterAll(async () => {
    await browser?.close();
    await running?.close();
    await db?.destroy();
    const admin = new pg.Client({ connectionString: inject('databaseUrl') });
    await admin.connect();
    await admin.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
    await admin.end();
  });

  it("after the demo: a task's page shows its timeline from the audit log and its checkpoints verified (signature checked), and live numbers arrive", async () => {
    const ctx = await as('root');
    const page = await ctx.newPage();
    await page.goto(`${running.url}/tasks?status=complete`);
    await page.click('a[href="/tasks/demo-0000"]');
    await expect.poll(() => page.locator('#status').textContent()).toBe('complete');
    expect(await page.locator('#timeline tr td:first-child').allTextContents()).toEqual([
      'v1',
      'v2',
      'v3',
      'v4',
      'v5',
    ]);
    const rows = await page.locator('#timeline tr').allTextContents();
    expect(rows.join('\n')).toContain('planner finished planning');
    expect(rows.join('\n')).toContain('spiffe://demo.cairn.local/agents/tester');
    const verdicts = await page.locator('#checkpoints tr td:last-child').allTextContents();
    expect(verdicts.length).toBeGreaterThanOrEqual(5);
    expect(new Set(verdicts)).toEqual(new Set(['ok']));
    await page.waitForFunction(`document.querySelector('[data-live="backlog"]').textContent !== '-'`);
    // The two parked keys' head messages wait in the outbox: the live backlog counts them.
    expect(await page.locator('[data-live="backlog"]').textContent()).toBe('2');
    await page.screenshot({ path: join(shots, 'console-task.png'), fullPage: true });
    await ctx.close();
  });

  it('a gated receipt resolved in the browser ("it ran"), and the task moves on without running the effect again', async () => {
    const ctx = await as('root');
    const page = await ctx.newPage();
    await page.goto(`${running.url}/humans`);
    const card = page.locator(`article[data-receipt="${gate.receiptId}"]`);
    await expect.poll(() => card.count()).toBe(1);
    const itRan = card.locator('form', { has: page.locator('button', { hasText: 'It ran' }) });
    await itRan.locator('input[name="reason"]').fill('deploy verified live by hand');
    await itRan.locator('button').click();
    await expect.poll(() => page.locator('#result').getAttribute('data-outcome')).toBe('done');

    // The agent resumes: its receipt now says succeeded, so the effect is not run again and the task goes on.
    let ran = 0;
    const store = createTaskStore({ db });
    const deploy = await createReceiptStore({ db }).runOnce({
      taskId: 'gate-a',
      step: 'deploy',
      tool: 'deployer',
      args: { to: 'prod' },
      onUncertain: 'gate',
      effect: async () => {
        ran++;
        return 'again';
      },
    });
    expect(deploy.status).toBe('succeeded');
    expect(ran).toBe(0);
    const task = await store.get('gate-a');
    await store.update({
      taskId: 'gate-a',
      expectedVersion: task!.version,
      patch: { status: 'implementing' },
      actor: AGENT,
      reason: 'deploy settled by an operator; moving on',
    });
    await page.goto(`${running.url}/tasks/gate-a`);
    expect(await page.locator('#status').textContent()).toBe('implementing');
    const receipts = await page.locator('#receipts').textContent();
    expect(receipts).toContain('succeeded');
    expect(receipts).toContain('spiffe://cairn.console/operator/root: deploy verified live by hand');
    expect(await page.locator('#timeline').textContent()).toContain(
      'deploy settled by an operator; moving on',
    );
    await ctx.close();
  });

  it('on the bus page: a parked key released and a dead letter replayed to its topic, each audited', async () => {
    const ctx = await as('root');
    const page = await ctx.newPage();
    await page.goto(`${running.url}/bus`);
    await page.screenshot({ path: join(shots, 'console-bus.png'), fullPage: true });
    const parked = page.locator('tr[data-key="order-7"]');
    const release = parked.locator('form', { has: page.locator('button', { hasText: 'Release' }) });
    await release.locator('input[name="reason"]').fill('broker limit raised');
    await release.locator('button').click();
    await expect.poll(() => page.locator('#result').getAttribute('data-outcome')).toBe('done');
    expect(await db.selectFrom('outbox_parked_key').select('key').execute()).toEqual([{ key: 'order-8' }]);
    expect(
      await db.selectFrom('outbox_operator_audit').select(['action', 'key', 'actor', 'reason']).execute(),
    ).toEqual([
      {
        action: 'release',
        key: 'order-7',
        actor: 'spiffe://cairn.console/operator/root',
        reason: 'broker limit raised',
      },
    ]);

    await page.goto(`${running.url}/bus`);
    await page.locator(`tr[data-message="${dlMessage}"] button`, { hasText: 'Replay' }).click();
    await expect.poll(() => page.locator('#result').getAttribute('data-outcome')).toBe('done');
    const kafka = kafkaClient(kafkaBrokers(), 'console-browser-test');
    const seen = await readTopic(kafka, dlTopic, (ms) => ms.length >= 1, 30_000);
    expect(seen.map((m) => m.headers['cairn-message-id'])).toEqual([dlMessage]);
    // Replayed: it is no longer offered on the page.
    await page.goto(`${running.url}/bus`);
    expect(await page.locator(`tr[data-message="${dlMessage}"]`).count()).toBe(0);
    await ctx.close();
  });

  it('a read-only user: every action button is disabled, and a post made from the page anyway gets 403', async () => {
    const ctx = await as('viewer');
    const page = await ctx.newPage();
    for (const path of ['/humans', '/bus', '/tasks/gate-a', '/tasks/demo-0001']) {
      await page.goto(`${running.url}${path}`);
      const buttons = page.locator('button[data-action]');
      expect(await buttons.count(), path).toBeGreaterThan(0);
      for (const b of await buttons.all()) expect(await b.isDisabled()).toBe(true);
      // Every form of the page posted from the page itself (form token included): all refused.
      const statuses = await page.evaluate<
        number[]
      >(`Promise.all([...document.querySelectorAll('form.action')].map(
        async (f) => (await fetch(f.action, { method: 'POST', body: new URLSearchParams(new FormData(f)) })).status))`);
      expect(new Set(statuses), path).toEqual(new Set([403]));
    }
    expect(
      await db.selectFrom('console_action').select('actor').where('role', '=', 'read').execute(),
    ).toEqual([]);
    await ctx.close();
  });

  it("tenant A's operator cannot open tenant B's task by URL, and sees none of the demo tenant's tasks", async () => {
    const ctx = await as('opsA');
    const page = await ctx.newPage();
    const response = await page.goto(`${running.url}/tasks/b-secret`);
    expect(response?.status()).toBe(404);
    expect(await page.locator('body').textContent()).not.toContain('tenant-b');
    await page.goto(`${running.url}/tasks`);
    const list = await page.locator('#tasks').textContent();
    expect(list).toContain('gate-a');
    expect(list).not.toContain('demo-0000');
    expect(list).not.toContain('b-secret');
    expect(list).not.toContain('gate-b');
    await ctx.close();
  });
});
