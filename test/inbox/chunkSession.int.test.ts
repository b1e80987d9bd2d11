// Chunks sized by pace (consumers/chunkSize.ts) after a rebalance: redelivered duplicates are
// fast, and sizing the next chunk on them (review finding: 500 -> 1000 -> 2000 -> 4000) made a
// chunk of fresh messages with a handler of a few ms run past the group's session (10 s) with
// no heartbeat (they go between chunks): the consumer was evicted and its offset commit failed.
import { setTimeout as sleep } from 'node:timers/promises';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { oneTopicOf, onTestBroker } from './fixtures.js';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase('chunk_session');
});
afterAll(async () => {
  await t?.drop();
});

it('a chunk never outlasts the session: duplicates first, then fresh messages at ~4 ms each', async () => {
  const N = 8000;
  const DUPS = 3500; // applied before a rebalance (their inbox rows exist): redelivered now
  const topic = await oneTopicOf('chunk-session', N);
  const group = `chunk-session-${Date.now()}`;
  await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset")
            SELECT ${group}, ${topic} || ':0:' || o, ${topic}, 0, o FROM generate_series(0, ${DUPS - 1}) o`.execute(
    t.db,
  );
  const chunks: Array<{ applied: number; duplicates: number; ms: number }> = [];
  let last = performance.now();
  const consumer = createInboxConsumer({
    db: t.db,
    groupId: group,
    ...onTestBroker(group, topic),
    handler: async () => {
      await sleep(3); // a handler of a few ms (a task update with its checkpoint, say)
    },
    onCommitted: (c) => {
      const now = performance.now();
      chunks.push({ ...c, ms: Math.round(now - last) });
      last = now;
    },
  });
  const running = consumer.run();
  try {
    await waitFor(
      'all consumed',
      async () => consumer.stats().applied + consumer.stats().duplicates >= N,
      120_000,
    );
  } finally {
    await consumer.stop();
    await running;
  }
  expect(Math.max(...chunks.map((c) => c.ms))).toBeLessThan(10_000);
  expect(consumer.stats().offsetCommitFailures).toBe(0);
}, 180_000);

it('a chunk grown on cheap messages keeps the session alive when its handlers turn slow (heartbeats inside the chunk)', async () => {
  // 7,500 messages the handler ignores grow the chunks 500 -> 1000 -> 2000 -> 4000 -> 5000;
  // the next 5,000 take ~3 ms each: one chunk of ~15 s, past the 10 s session.
  const CHEAP = 7500;
  const N = CHEAP + 5000;
  const topic = await oneTopicOf('chunk-slow', N, (i) => (i < CHEAP ? 'ignore' : 'work'));
  const group = `chunk-slow-${Date.now()}`;
  const consumer = createInboxConsumer({
    db: t.db,
    groupId: group,
    ...onTestBroker(group, topic),
    handler: async (_trx, m) => {
      if (m.value?.toString() === 'work') await sleep(3);
    },
  });
  const running = consumer.run();
  try {
    await waitFor('all applied', async () => consumer.stats().applied >= N, 150_000);
  } finally {
    await consumer.stop();
    await running;
  }
  expect(consumer.stats()).toMatchObject({ applied: N, duplicates: 0, offsetCommitFailures: 0 });
}, 180_000);
