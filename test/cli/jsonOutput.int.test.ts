import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cli/stack/paths.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { newTask } from '../state/fixtures.js';
import { cairnBundle } from '../support/cli.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';

const exec = promisify(execFile);
let t: TestDatabase;
let topic: string;
const taskId = 'json-task-1';

/** The real CLI, from source, as an operator's shell runs it. */
async function cairn(
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number; out: string; err: string }> {
  try {
    const r = await exec(process.execPath, [cairnBundle(), ...args], {
      cwd: repoRoot,
      env: { ...process.env, DATABASE_URL: t.url, KAFKA_BROKERS: kafkaBrokers().join(','), ...env },
    });
    return { code: 0, out: r.stdout, err: r.stderr };
  } catch (e) {
    const x = e as { code: number; stdout: string; stderr: string };
    return { code: x.code, out: x.stdout, err: x.stderr };
  }
}

beforeAll(async () => {
  t = await createTestDatabase('cli_json');
  topic = await createTestTopic('cli-json', 1);
  await createTaskStore({ db: t.db }).create({
    task: newTask(taskId),
    actor: 'spiffe://cairn.test/agent/json',
  });
});
afterAll(async () => {
  await t?.drop();
});

describe('cairn --json', () => {
  it('prints the data of every reading command as JSON on stdout, exit 0', async () => {
    const reads: Array<[string[], (data: unknown) => void]> = [
      [['--version', '--json'], (d) => expect(d).toMatchObject({ name: '@cairn-state/cairn' })],
      [
        ['migrate', '--status', '--json'],
        (d) => expect((d as Array<{ name: string; executedAt: string }>)[0]!.executedAt).toBeTruthy(),
      ],
      [['migrate', '--json'], (d) => expect(d).toEqual({ schema: 'cairn', ran: [] })],
      [['task', 'show', taskId, '--json'], (d) => expect(d).toMatchObject({ state: { task_id: taskId } })],
      [['task', 'history', taskId, '--json'], (d) => expect(d).toMatchObject([{ version: 1 }])],
      [['checkpoint', 'list', taskId, '--json'], (d) => expect(d).toEqual([])],
      [['checkpoint', 'verify', taskId, '--json'], (d) => expect(d).toEqual([])],
      [['outbox', 'status', '--json'], (d) => expect(d).toMatchObject({ backlog: 0, parked_keys: 0 })],
      [['outbox', 'parked', '--json'], (d) => expect(d).toEqual([])],
      [['inbox', 'dlq', '--json'], (d) => expect(d).toEqual([])],
      [['inbox', 'prune', '--json'], (d) => expect(d).toEqual({ pruned: 0, older_than_hours: 168 })],
      [['hold', 'list', '--json'], (d) => expect(d).toEqual([])],
      [['retention', 'certificates', '--json'], (d) => expect(d).toEqual([])],
      [
        ['failover', 'check', '--topics', topic, '--json'],
        (d) => expect(d).toMatchObject({ divergedTasks: [], quarantined: 0 }),
      ],
      [
        ['stack', 'status', '--json'],
        (d) =>
          expect(d).toMatchObject({
            ok: true,
            postgres: { reachable: true },
            kafka: {
              source: 'KAFKA_BROKERS',
              brokers: kafkaBrokers().map((address) => ({ address, reachable: true })),
            },
          }),
      ],
    ];
    for (const [args, check] of reads) {
      const r = await cairn(args);
      expect({ args, code: r.code, err: r.err }).toEqual({ args, code: 0, err: '' });
      check(JSON.parse(r.out));
    }
  });

  it('prints an error as one JSON object on stderr, with the exit code the same error has without --json', async () => {
    const errors: Array<{ args: string[]; env?: Record<string, string>; code: number; error: string }> = [
      { args: ['no-such-command'], code: 2, error: 'usage' },
      { args: ['task', 'show', taskId, '--no-such-flag'], code: 2, error: 'usage' },
      { args: ['outbox', 'skip', 'not-a-uuid', '--reason', 'r'], code: 2, error: 'usage' },
      { args: ['hold', 'frobnicate'], code: 2, error: 'usage' },
      { args: ['stack', 'status', 'extra'], code: 2, error: 'usage' },
      { args: ['task', 'show', 'no-such-task'], code: 1, error: 'not_found' },
      { args: ['outbox', 'status'], env: { DATABASE_URL: 'mysql://nope' }, code: 78, error: 'configuration' },
    ];
    for (const e of errors) {
      const text = await cairn(e.args, e.env);
      const json = await cairn([...e.args, '--json'], e.env);
      expect({ args: e.args, text: text.code, json: json.code }).toEqual({
        args: e.args,
        text: e.code,
        json: e.code,
      });
      expect(json.out).toBe('');
      expect(json.err.trim().split('\n')).toHaveLength(1);
      const body = JSON.parse(json.err) as { error: { code: string; message: string; retriable: boolean } };
      expect(Object.keys(body)).toEqual(['error']);
      expect(body.error).toEqual({ code: e.error, message: expect.any(String), retriable: false });
      // The same message an operator reads without --json.
      expect(text.err).toContain(`[${e.error}] `);
      expect(text.err).toContain(body.error.message.split('\n')[0]);
    }
  });
});
