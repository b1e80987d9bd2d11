// The inbox consumer's heartbeats inside a chunk (consumers/heartbeat.ts), against the two
// ways they went wrong (review findings):
// - awaited inside the chunk's transaction, a coordinator that does not answer (kafkajs waits
//   its request timeout, 15 s) kept the transaction idle with the chunk's inbox rows locked:
//   the partition's next owner blocked on them (and handlers ran one per 15 s);
// - swallowed, a failed heartbeat (REBALANCE_IN_PROGRESS) never told a member busy in a long
//   batch to rejoin: the group stood still until kafkajs's rebalance timeout (60 s).
import { setTimeout as sleep } from 'node:timers/promises';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
import type { ReceivedBatch, Subscriber } from '../../src/kafka/subscriber.js';
import { pausePoint } from '../support/pausePoint.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase } from '../support/testDatabase.js';
import { nowherePublisher, oneTopicOf, onTestBroker, stubMessages } from './fixtures.js';

let t: TestDatabase;
const kafka = kafkaClient(kafkaBrokers(), 'inbox-heartbeat');
beforeAll(async () => {
  t = await createTestDatabase('inbox_heartbeat');
});
afterAll(async () => {
  await t?.drop();
});

it('a heartbeat the coordinator does not answer holds no Postgres transaction open', async () => {
  const beatHeld = pausePoint();
  let beats = 0;
  let done!: () => void;
  const finished = new Promise<void>((r) => (done = r));
  const msgs = stubMessages('m', 3);
  const subscriber: Subscriber = {
    async run(eachBatch) {
      const batch: ReceivedBatch = {
        topic: 't',
        partition: 0,
        messages: msgs,
        isActive: () => true,
        // The coordinator does not answer until the test releases it.
        heartbeat: async () => {
          beats++;
          await beatHeld.hold();
        },
        resolveOffset: () => {},
      };
      void eachBatch(batch).finally(done);
    },
    waiting: () => false,
    commit: async () => {},
    stop: async () => {},
  };
  const handled: string[] = [];
  const consumer = createInboxConsumer({
    db: t.db,
    groupId: 'g',
    subscriber,
    dlqPublisher: nowherePublisher,
    // The first handler takes a bit over a second: the chunk's heartbeat is due after it.
    handler: async (_trx, m) => {
      if (m.offset === '0') await sleep(1100);
      handled.push(m.messageId);
    },
  });
  await consumer.run();
  await beatHeld.reached;
  // Step "heartbeat pending": the chunk goes on and commits without waiting for it.
  await finished;
  const open = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM pg_stat_activity
     WHERE datname = current_database() AND state LIKE 'idle in transaction%'`.execute(t.db);
  // The partition's next owner inserting message m-2's inbox row (what its first chunk does).
  const taken = await t.db.transaction().execute(async (trx) => {
    await sql`SET LOCAL lock_timeout = '2s'`.execute(trx);
    return sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset", key)
              VALUES ('g', 'm-2', 't', 0, 2, 'k')
              ON CONFLICT (consumer_group, (coalesce(tenant_id, '')), message_id) DO NOTHING`.execute(trx);
  });
  beatHeld.release();
  await consumer.stop();
  expect({ beats, handled, idleInTransaction: open.rows[0]!.n, inserted: taken.numAffectedRows }).toEqual({
    beats: 1,
    handled: ['m-0', 'm-1', 'm-2'],
    idleInTransaction: 0,
    inserted: 0n, // applied and committed already: a duplicate for the next owner
  });
}, 60_000);

it('a member busy in a long batch rejoins when another joins: the group is stable again within 20 s, not 60', async () => {
  const N = 30_000;
  const topic = await oneTopicOf('heartbeat-rebalance', N);
  const admin = kafka.admin();
  await admin.connect();
  const group = `heartbeat-rebalance-${Date.now()}`;
  const make = (name: string) =>
    createInboxConsumer({
      db: t.db,
      groupId: group,
      ...onTestBroker(group, topic, name),
      handler: async () => {
        await sleep(3); // 30,000 x 3 ms: A is busy for about 90 s
      },
    });
  const a = make('A');
  const b = make('B');
  const runA = a.run();
  let stableAfterMs = -1;
  let appliedByA = 0;
  try {
    await sleep(5_000);
    const runB = b.run();
    const joined = Date.now();
    while (Date.now() - joined < 40_000) {
      await sleep(500);
      const { groups } = await admin.describeGroups([group]);
      if (groups[0]?.state === 'Stable' && groups[0].members.length === 2) {
        stableAfterMs = Date.now() - joined;
        break;
      }
    }
    appliedByA = a.stats().applied;
    await Promise.all([a.stop(), b.stop()]);
    await Promise.all([runA, runB]);
  } finally {
    await admin.disconnect();
  }
  expect(appliedByA).toBeLessThan(N); // A was still busy when B joined
  expect(stableAfterMs).toBeGreaterThan(0);
  expect(stableAfterMs).toBeLessThan(20_000);
}, 180_000);

it('a chunk that fails after a heartbeat failed still moves: one by one until the failure is seen, that offset committed', async () => {
  const msgs = stubMessages('fallback', 3);
  let runBatch!: (b: ReceivedBatch) => Promise<void>;
  const commits: string[] = [];
  const subscriber: Subscriber = {
    async run(eachBatch) {
      runBatch = eachBatch;
    },
    waiting: () => false,
    commit: async (_t, _p, next) => {
      commits.push(next);
    },
    stop: async () => {},
  };
  const consumer = createInboxConsumer({
    db: t.db,
    groupId: 'fallback',
    subscriber,
    dlqPublisher: nowherePublisher,
    maxAttempts: 1,
    handler: async (_trx, m) => {
      if (m.offset === '0') await sleep(1100); // the heartbeat comes due after it
      if (m.offset === '2') throw new Error('poison'); // fails the chunk
    },
  });
  await consumer.run();
  // The broker hands the batch out again from the committed offset, each time with a
  // heartbeat that fails (a group rebalancing again and again).
  for (let round = 0; round < 4 && commits.at(-1) !== '3'; round++) {
    const from = Number(commits.at(-1) ?? 0);
    await runBatch({
      topic: 't',
      partition: 0,
      messages: msgs.slice(from),
      isActive: () => true,
      heartbeat: async () => {
        throw new Error('The group is rebalancing, so a rejoin is needed');
      },
      resolveOffset: () => {},
    });
  }
  await consumer.stop();
  expect(commits.at(-1)).toBe('3');
  expect({ applied: consumer.stats().applied, deadLettered: consumer.stats().deadLettered }).toEqual({
    applied: 2,
    deadLettered: 1,
  });
}, 60_000);
