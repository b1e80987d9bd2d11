import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRelay, createRelayWithTestHooks } from '../../relay/relay.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { laneOf } from '../../src/outbox/lanes.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { pausePoint } from '../support/pausePoint.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';

/**
 * Lane take-over with a slow relay, not a dead one: R1 publishes a batch and freezes before
 * deleting it, past its lane lease; R2 takes the lane over, publishes the same rows again and
 * the key's next ones; then R1 wakes and finishes what it started. Its delete is fenced off
 * (it no longer owns the lane), nothing is lost, the repeats carry the same message ids, and
 * the first copy of every message reaches the topic in commit order.
 */
let tdb: TestDatabase;
let topic: string;
const outbox = createOutbox();

beforeAll(async () => {
  tdb = await createTestDatabase('lane_takeover');
  topic = await createTestTopic('lane-takeover', 1);
});
afterAll(async () => {
  await tdb?.drop();
});

const enqueue = (n: number) =>
  tdb.db
    .transaction()
    .execute(async (t) => (await outbox.enqueue(t, [{ topic, key: 'k', payload: { n } }]))[0]!);

describe('relay lane take-over', () => {
  it('a relay frozen between publish and delete past its lease: its delete is fenced, nothing lost, first copies in order', async () => {
    const first: string[] = [];
    for (let n = 1; n <= 5; n++) first.push(await enqueue(n));

    const freeze = pausePoint();
    const r1 = createRelayWithTestHooks(
      {
        db: tdb.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        instanceId: 'r1',
        leaseTtlMs: 1000,
      },
      {
        afterPublish: async (batch) => {
          if (batch === 1) await freeze.hold(); // frozen here: published, not yet deleted
        },
      },
    );
    const r1Done = r1.run();
    await freeze.reached;
    const lane = laneOf('k');
    await waitFor('r1 to lose its lane by the database clock', async () => {
      const { rows } = await sql<{ expired: boolean }>`
        SELECT expires_at <= now() AS expired FROM relay_lane WHERE lane = ${lane}`.execute(tdb.db);
      return rows[0]?.expired === true;
    });

    const r2 = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      instanceId: 'r2',
      leaseTtlMs: 1000,
    });
    const r2Done = r2.run();
    const later: string[] = [];
    try {
      await waitFor('r2 to publish and delete the batch r1 froze on', async () => {
        const left = await tdb.db.selectFrom('outbox').select('message_id').execute();
        return left.length === 0;
      });
      for (let n = 6; n <= 8; n++) later.push(await enqueue(n));
      await waitFor('r2 to publish the key’s next messages', async () => {
        const left = await tdb.db.selectFrom('outbox').select('message_id').execute();
        return left.length === 0;
      });

      freeze.release(); // r1 finishes what it started
      await waitFor('r1 to try its delete', async () => r1.stats().lostLaneDeletes > 0);
      expect(r1.stats().lostLaneDeletes).toBe(5);
    } finally {
      freeze.release();
      await r1.stop();
      await r2.stop();
      await Promise.all([r1Done, r2Done]);
    }

    const all = [...first, ...later];
    const got = await readTopic(
      kafkaClient(kafkaBrokers(), 'lane-takeover-reader'),
      topic,
      (ms) => all.every((id) => ms.some((m) => m.headers['cairn-message-id'] === id)),
      30_000,
    );
    const ids = got.map((m) => m.headers['cairn-message-id']!);
    const firstCopies = ids.filter((id, i) => ids.indexOf(id) === i);
    expect(firstCopies).toEqual(all); // every message, first copies in commit order
    expect(ids.every((id) => all.includes(id))).toBe(true); // repeats carry the same ids
    expect(ids.filter((id) => first.includes(id)).length).toBe(10); // r1's batch, then r2's copy
  });
  it('a prefetched batch claimed before the lane was lost and taken back is not sent again, nor counted as rows gone', async () => {
    const k = 'prefetch';
    const sent: string[] = [];
    for (let n = 1; n <= 10; n++)
      sent.push(
        await tdb.db
          .transaction()
          .execute(async (t) => (await outbox.enqueue(t, [{ topic, key: k, payload: { n } }]))[0]!),
      );
    const freeze = pausePoint();
    // Batches of 5: the first is full, so the next 5 are claimed (prefetched) before it is published.
    const r1 = createRelayWithTestHooks(
      {
        db: tdb.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        instanceId: 'r1-prefetch',
        leaseTtlMs: 1000,
        batchSize: 5,
      },
      {
        afterPublish: async (batch) => {
          if (batch === 1) await freeze.hold();
        },
      },
    );
    const r1Done = r1.run();
    try {
      await freeze.reached;
      await waitFor('r1 to lose its lane by the database clock', async () => {
        const { rows } = await sql<{ expired: boolean }>`
          SELECT expires_at <= now() AS expired FROM relay_lane WHERE lane = ${laneOf(k)}`.execute(tdb.db);
        return rows[0]?.expired === true;
      });
      const r2 = createRelay({
        db: tdb.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        instanceId: 'r2-prefetch',
        leaseTtlMs: 1000,
      });
      const r2Done = r2.run();
      await waitFor('r2 to send and delete all 10', async () => {
        const left = await tdb.db.selectFrom('outbox').select('id').execute();
        return left.length === 0;
      });
      await r2.stop(); // its lanes are free: r1 takes them back under new tokens
      await r2Done;
      freeze.release();
      await waitFor('r1 to find its delete fenced', async () => r1.stats().lostLaneDeletes > 0);
      await waitFor('r1 to hold every lane again', async () => r1.stats().lanesOwned === 32);
      await waitFor('r1 to poll an empty outbox', async () => r1.stats().idleMs >= 8);
      // Only the first batch (published before the freeze); the prefetch was r2's to send.
      expect(r1.stats()).toMatchObject({ published: 5, lostLaneDeletes: 5, goneBeforeDelete: 0 });
    } finally {
      freeze.release();
      await r1.stop();
      await r1Done;
    }
  });
});
