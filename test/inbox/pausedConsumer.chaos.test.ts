// A consumer paused (SIGSTOP: a VM frozen, a process stopped in a debugger) with its chunk's
// transaction open, its partition moved to another member (review finding): the new owner
// inserted the same message ids and waited on the paused one's uncommitted inbox rows forever
// (no lock_timeout, no idle_in_transaction_session_timeout), with no heartbeat, until its own
// session expired too. Now it tries again (lock_timeout) while Postgres ends the paused
// transaction (idle_in_transaction_session_timeout), and the inbox keeps each effect once
// when the paused one wakes up.
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { sigkill, sigterm, spawnTs } from '../support/processes.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { createEffectsTable, effectStats, produceKeyed } from './fixtures.js';

let tdb: TestDatabase;
beforeAll(async () => {
  tdb = await createTestDatabase('inbox_paused', { max: 6 });
  await createEffectsTable(tdb.db);
});
afterAll(async () => {
  await tdb.drop();
});

const stopped = (pid: number) =>
  readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.startsWith('T') ?? false;

it("a consumer SIGSTOPped inside its chunk: the partition's new owner applies everything while it is still stopped, and every effect is applied exactly once after it wakes", async () => {
  const topic = await createTestTopic('inbox-paused', 1);
  const group = `${topic}.g`;
  const ids = await produceKeyed(kafkaBrokers(), topic, 10, 20); // 200 messages
  const env = (name: string, extra: Record<string, string> = {}) => ({
    DATABASE_URL: tdb.url,
    KAFKA_BROKERS: kafkaBrokers().join(','),
    GROUP: group,
    TOPIC: topic,
    CONSUMER_NAME: name,
    CHUNK_SIZE: '50',
    ...extra,
  });
  // A stops in the handler of its 75th message: chunk 1 (50) committed, chunk 2 open with 25
  // effects and 50 inbox rows written. Its handler deadline (15 s) is past its session (6 s):
  // the partition moves to B before Postgres ends A's transaction (15 + 5 s idle).
  const a = spawnTs(
    'paused-a',
    'test/support/effectConsumer.ts',
    env('a', {
      CAIRN_FAULT_STOP_AT_MESSAGE: '75',
      HANDLER_TIMEOUT_MS: '15000',
    }),
  );
  const b = { child: undefined as ReturnType<typeof spawnTs> | undefined };
  try {
    await waitFor('A to stop itself in its chunk', () => stopped(a.proc.pid!), 60_000);
    b.child = spawnTs('paused-b', 'test/support/effectConsumer.ts', env('b'));
    await waitFor(
      'B to apply every message while A is stopped',
      async () => (await effectStats(tdb.db)).distinct_ids >= ids.length,
      90_000,
    );
    expect(stopped(a.proc.pid!)).toBe(true);
    // B met A's rows and tried again (lock_timeout) rather than waiting on them.
    expect(b.child.output()).toContain('chunk waits on rows another consumer holds');
    a.proc.kill('SIGCONT');
    // A wakes with its connection gone: its chunk fails, and it finds the messages applied.
    await waitFor('A to run again', () => a.output().includes('chunk failed'), 20_000).catch(() => {});
    const stats = await effectStats(tdb.db);
    expect(stats).toEqual({ total: ids.length, distinct_ids: ids.length, doubled: 0 });
  } finally {
    a.proc.kill('SIGCONT');
    await sigkill(a);
    if (b.child) await sigterm(b.child);
  }
}, 180_000);
