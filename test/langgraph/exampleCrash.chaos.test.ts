import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CairnSaver } from '../../langgraph/index.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { type Sink, startSink } from '../support/effectSink.js';
import { type Child, sigkill, spawnTs } from '../support/processes.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { readTopic } from '../support/topicReader.js';

/**
 * examples/langgraph as a real process, SIGKILLed at a named point and run again with the same
 * thread: the resume continues from the newest verified checkpoint and the deploy reaches the
 * HTTP sink under one idempotency key, applied once.
 */
const POINTS = [
  // The coder's CAS, audit row and outbox message committed; LangGraph never recorded the coder.
  'coder:after-commit',
  // The deploy API applied the deploy; the receipt still says started.
  'deploy:after-effect',
  // The receipt says succeeded; the task is still in testing.
  'deploy:after-receipt',
] as const;
const AGENTS = ['orchestrator', 'planner', 'coder', 'reviewer', 'tester', 'deploy'];

let tdb: TestDatabase;
let sink: Sink;
let topic: string;
beforeAll(async () => {
  tdb = await createTestDatabase('langgraph_example', { max: 4 });
  sink = await startSink();
  topic = await createTestTopic('langgraph-example', 1);
});
afterAll(async () => {
  await sink?.close();
  await tdb?.drop();
});

function runExample(thread: string, killAt?: string): Child {
  return spawnTs(
    `example-${thread}`,
    [
      'examples/langgraph/main.ts',
      ...['--thread', thread, '--database-url', tdb.url, '--brokers', kafkaBrokers().join(',')],
      ...['--topic', topic, '--deploy-url', sink.url],
    ],
    { CAIRN_EXAMPLE_KILL_AT: killAt ?? '' },
  );
}

/** The child's exit, or a SIGKILL and an error with its output once the deadline passed. */
async function exitOf(child: Child, deadlineMs = 90_000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'late'>((r) => {
    timer = setTimeout(() => r('late'), deadlineMs);
  });
  const outcome = await Promise.race([child.exited, late]);
  clearTimeout(timer);
  if (outcome === 'late') {
    await sigkill(child);
    throw new Error(`${child.name} still running after ${deadlineMs} ms:\n${child.output()}`);
  }
}

describe('the LangGraph example killed at a named point and resumed (real processes)', () => {
  for (const point of POINTS) {
    it(`killed at ${point}: the resume completes the task through CAS versions 1..6, publishes every step's message, and the deploy is applied once`, async () => {
      const thread = `lg-${point.replace(/:/g, '-')}`;
      const first = runExample(thread, point);
      await exitOf(first);
      expect(first.proc.signalCode, first.output()).toBe('SIGKILL');
      expect(first.output()).toContain(`SIGKILL at ${point}`);

      const second = runExample(thread);
      await exitOf(second);
      expect(second.proc.exitCode, second.output()).toBe(0);
      const summary = JSON.parse(second.output().trim().split('\n').at(-1)!);
      expect(summary).toMatchObject({ thread, finished: true, status: 'complete', version: 6 });
      expect(summary.resumedFrom?.next).toEqual([point.split(':')[0]]);

      // TaskState: complete at version 6, one audit row per version, each by the agent of its step.
      const task = await tdb.db
        .selectFrom('task_state')
        .select(['status', 'version'])
        .where('task_id', '=', thread)
        .executeTakeFirstOrThrow();
      expect(task).toEqual({ status: 'complete', version: 6 });
      const history = await createTaskStore({ db: tdb.db }).history(thread);
      expect(history.map((a) => [a.version, a.prev_version])).toEqual([
        [1, null],
        [2, 1],
        [3, 2],
        [4, 3],
        [5, 4],
        [6, 5],
      ]);
      expect(history.map((a) => a.actor.split('/').at(-1))).toEqual(AGENTS);

      // The outbox: every step's message was published (none left), in version order per key.
      const left = await sql<{
        n: number;
      }>`SELECT count(*)::int AS n FROM outbox WHERE task_id = ${thread}`.execute(tdb.db);
      expect(left.rows[0]!.n).toBe(0);
      const versionsOf = (ms: Array<{ key: string; headers: Record<string, string> }>) =>
        ms.filter((m) => m.key === thread).map((m) => Number(m.headers['cairn-task-version']));
      const read = await readTopic(
        kafkaClient(kafkaBrokers(), 'cairn-test-example'),
        topic,
        (ms) => new Set(versionsOf(ms)).size === 6,
      );
      const seen = versionsOf(read);
      expect([...new Set(seen)]).toEqual([1, 2, 3, 4, 5, 6]);
      // The line above is the order check: versions in order by first arrival (what an inbox
      // applies). A copy of a batch the killed process published and had not deleted comes again
      // after it (seen in CI: 1, 2, 1, 2, 3, ...), as the relay's crash test allows
      // (test/relay/relayCrash.chaos: per-key order by first occurrence).

      // The deploy: one receipt, succeeded; the sink saw one idempotency key and applied it once.
      const receipts = await tdb.db
        .selectFrom('tool_receipt')
        .select(['status', 'attempt', 'idempotency_key'])
        .where('task_id', '=', thread)
        .execute();
      expect(receipts).toHaveLength(1);
      const receipt = receipts[0]!;
      expect(receipt.status).toBe('succeeded');
      expect([...(sink.keysByOperation.get(thread) ?? [])]).toEqual([receipt.idempotency_key]);
      expect(sink.applied.get(receipt.idempotency_key)).toBe(1);
      // Killed after the API answered: the resume called it again under the same key (attempt 2),
      // and the API deduplicated. Killed after the receipt said succeeded: not called again.
      expect(receipt.attempt).toBe(point === 'deploy:after-effect' ? 2 : 1);
      expect(summary.deployment.calledHere).toBe(point !== 'deploy:after-receipt');

      // LangGraph's side: nothing skipped as corrupt, no fork refused, and the thread is finished.
      const saver = new CairnSaver({ db: tdb.db });
      expect(await saver.events(thread)).toEqual([]);
      const head = await saver.getTuple({ configurable: { thread_id: thread } });
      expect(head?.checkpoint.channel_values).toMatchObject({ taskId: thread, taskVersion: 6 });
    });
  }
});
