import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { cairnBundle } from '../support/cli.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const run = promisify(execFile);
let tdb: TestDatabase;

function v1Doc(taskId: string, status: string) {
  return {
    schema_version: 'oaies.task-state.v1',
    task_id: taskId,
    version: 3,
    status,
    gates: {
      plan_approved: true,
      implementation_complete: false,
      review_passed: false,
      tests_passing: false,
      security_approved: false,
      deployment_approved: false,
    },
    artifacts: { implementation_plan: 's3://plans/old' },
    active_agents: ['coder'],
    completed_agents: ['planner'],
    failed_agents: [],
    updated_at: '2025-06-01T12:00:00.000Z',
    updated_by: 'spiffe://acme.example/agents/legacy',
  };
}

beforeAll(async () => {
  tdb = await createTestDatabase('schema_upgrade');
  // Rows as an older Cairn wrote them: raw SQL, v1 documents, no budget/digest/intent.
  for (const [id, status] of [
    ['legacy-1', 'implementing'],
    ['legacy-2', 'reviewing'],
    ['legacy-done', 'complete'],
  ] as const) {
    await sql`INSERT INTO task_state (task_id, tenant_id, version, schema_version, status, doc)
              VALUES (${id}, 'acme', 3, 'oaies.task-state.v1', ${status}, ${JSON.stringify(v1Doc(id, status))}::jsonb)`.execute(
      tdb.db,
    );
  }
});
afterAll(async () => {
  await tdb.drop();
});

describe('schema upgrade v1 -> v2', () => {
  it('reads v1 rows as v2 through the upcaster', async () => {
    const store = createTaskStore({ db: tdb.db });
    expect(await store.get('legacy-1')).toMatchObject({
      schema_version: 'oaies.task-state.v2',
      tenant_id: 'acme',
      version: 3,
      status: 'implementing',
      budget: { currency_committed_usd: 0, currency_spent_usd: 0, tokens_spent: 0, hops_used: 0 },
      workflow_digest: null,
      intent_id: null,
    });
  });

  it('`cairn state upgrade` rewrites live v1 rows through CAS with an audit row, and leaves terminal ones as stored', async () => {
    const { stdout } = await run(process.execPath, [cairnBundle(), 'state', 'upgrade'], {
      cwd: repoRoot,
      env: { ...process.env, DATABASE_URL: tdb.url },
    });
    expect(JSON.parse(stdout.trim().split('\n').at(-1)!)).toEqual({
      upgraded: 2,
      terminalLeftAsIs: 1,
      raced: 0,
    });

    const rows = await tdb.db
      .selectFrom('task_state')
      .select(['task_id', 'version', 'schema_version'])
      .orderBy('task_id')
      .execute();
    expect(rows).toEqual([
      { task_id: 'legacy-1', version: 4, schema_version: 'oaies.task-state.v2' },
      { task_id: 'legacy-2', version: 4, schema_version: 'oaies.task-state.v2' },
      { task_id: 'legacy-done', version: 3, schema_version: 'oaies.task-state.v1' },
    ]);
    const store = createTaskStore({ db: tdb.db });
    const audit = await store.history('legacy-1');
    expect(audit).toHaveLength(1);
    expect(audit[0]).toMatchObject({
      version: 4,
      prev_version: 3,
      reason: 'schema upgrade to oaies.task-state.v2',
    });
    expect(audit[0]!.patch).toContainEqual({
      op: 'replace',
      path: '/schema_version',
      value: 'oaies.task-state.v2',
    });

    // A second run has nothing left to do.
    const again = await run(process.execPath, [cairnBundle(), 'state', 'upgrade'], {
      cwd: repoRoot,
      env: { ...process.env, DATABASE_URL: tdb.url },
    });
    expect(JSON.parse(again.stdout.trim().split('\n').at(-1)!)).toEqual({
      upgraded: 0,
      terminalLeftAsIs: 1,
      raced: 0,
    });
  });
});
