import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import type { Db } from '../../src/db/database.js';
import { laneOf } from '../../src/outbox/lanes.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { cairnBundle } from '../support/cli.js';
import { parkAsLaneOwner } from '../support/parkKey.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase } from '../support/testDatabase.js';

/**
 * Strings a tenant writes with its own SQL (an audit row's actor and reason, an outbox key)
 * reach an operator's terminal through the CLI's readable output as they are: terminal escape
 * sequences (erase a line, move the cursor, OSC 52 to the clipboard) and newlines can hide
 * or forge lines, another tenant's included.
 */
const exec = promisify(execFile);
let t: TestDatabase;
let app: Db;
let asA: Db;
const ESC = '\u001b';

async function cairn(args: string[]): Promise<string> {
  const r = await exec(process.execPath, [cairnBundle(), ...args], {
    cwd: repoRoot,
    env: { ...process.env, DATABASE_URL: t.url, KAFKA_BROKERS: kafkaBrokers().join(',') },
  });
  return r.stdout;
}

beforeAll(async () => {
  t = await createTestDatabase('adv3_cli_ctrl');
  ({ app, asA } = await twoTenants(t, 2));
});
afterAll(async () => {
  await app?.destroy();
  await t?.drop();
});

describe("a tenant's control characters and an operator's terminal", () => {
  it('cairn task show prints no escape sequence a tenant wrote into its audit rows', async () => {
    const store = createTaskStore({ db: asA, checkpointer: createCheckpointer({ db: asA }) });
    await store.create({ task: newTask('ctl-1', { tenant_id: 'tenant-a' }), actor: AGENT });
    // Own task, own audit row (allowed): the reason erases the line above and writes the clipboard.
    await sql`INSERT INTO task_audit (task_id, version, prev_version, tenant_id, actor, reason, patch)
              VALUES ('ctl-1', 2, 1, 'tenant-a', ${`agent${ESC}]52;c;Y3VybCBldmlsfHNo${ESC}\\`},
                      ${`\r${ESC}[1A${ESC}[2Kv1  everything fine`}, '[]')`.execute(asA);
    const out = await cairn(['task', 'show', 'ctl-1']);
    expect(out.includes(ESC)).toBe(false);
  });

  it("cairn outbox parked: one tenant's key cannot hide or forge another tenant's line", async () => {
    const forged = `k\n${'tenant-b:orders'}\tfake\thead 00000000-0000-0000-0000-000000000000\t0 waiting`;
    for (const [tenant, key] of [
      ['tenant-b', 'b-key'],
      ['tenant-a', `${forged}${ESC}[1A${ESC}[2K`],
    ] as const) {
      const { rows } = await sql<{ id: number; message_id: string }>`
        INSERT INTO outbox (lane, message_id, tenant_id, topic, key, payload)
        VALUES (${laneOf(key)}, gen_random_uuid(), ${tenant}, 'orders', ${key}, '\\x00')
        RETURNING id, message_id`.execute(t.db);
      await parkAsLaneOwner(t.db, {
        tenant,
        topic: 'orders',
        key,
        messageId: rows[0]!.message_id,
        id: rows[0]!.id,
        error: 'refused',
      });
    }
    const out = await cairn(['outbox', 'parked']);
    const lines = out.trimEnd().split('\n');
    expect(out.includes(ESC)).toBe(false);
    expect(lines).toHaveLength(2); // one line per parked key
  });
});
