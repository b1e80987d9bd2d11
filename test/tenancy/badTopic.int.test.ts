import { type SelectQueryBuilder, sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRelay, createRelayWithTestHooks, type Relay, type RelayOptions } from '../../relay/relay.js';
import type { Db } from '../../src/db/database.js';
import type { Database } from '../../src/db/types.js';
import { createKafkaAdmin } from '../../src/kafka/admin.js';
import { createKafkaPublisher, type Publisher } from '../../src/kafka/publisher.js';
import { laneOf } from '../../src/outbox/lanes.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { twoTenants } from '../support/tenants.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

/**
 * The outbox's `topic` is any text a tenant's own INSERT gives it (no CHECK; the library
 * validates topics at enqueue only). A topic the client refuses before asking the broker is
 * not one of the refusals the relay parks a key for (src/kafka/classifyError.ts): kafkajs
 * throws KafkaJSNonRetriableError('Invalid topic') for an empty one, so the relay fails the
 * whole batch, retries it forever and every lane it owns stops.
 */
let tdb: TestDatabase;
let topic: string;
let app: Db;
let asA: Db;
let asB: Db;
const outbox = createOutbox();

beforeAll(async () => {
  tdb = await createTestDatabase('adv3_bad_topic');
  topic = await createTestTopic('adv3-bad-topic', 1);
  ({ app, asA, asB } = await twoTenants(tdb, 2));
});
afterAll(async () => {
  await app?.destroy();
  await tdb?.drop();
});

describe("a tenant's own outbox row naming a topic no broker accepts", () => {
  it.each([
    ['empty', ''],
    ['too long', 'x'.repeat(300)],
    ['with a space', 'no such topic'],
  ])(
    "(%s) is refused at insert; one written before migration 0017 parks its own key only, and another tenant's messages go on",
    async (_label, bad) => {
      const insert = () =>
        sql`INSERT INTO outbox (lane, message_id, topic, key, payload)
              VALUES (${laneOf('k')}, gen_random_uuid(), ${bad}, 'k', '\\x00')`.execute(asA);
      await expect(insert()).rejects.toThrow(/outbox_topic_name/);
      // A row from before 0017 (its CHECK is NOT VALID: rows already there stay).
      await sql`ALTER TABLE outbox DROP CONSTRAINT outbox_topic_name`.execute(tdb.db);
      await insert();
      await sql`ALTER TABLE outbox ADD CONSTRAINT outbox_topic_name
                CHECK (topic ~ '^[A-Za-z0-9._-]{1,249}$' AND topic NOT IN ('.', '..')) NOT VALID`.execute(
        tdb.db,
      );
      await asB.transaction().execute((t) => outbox.enqueue(t, [{ topic, key: 'b1', payload: { n: 1 } }]));
      const relay = createRelay({
        db: tdb.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        instanceId: 'r1',
        publishRetries: 1,
      });
      const run = relay.run();
      try {
        await waitFor(
          "tenant B's message to be published",
          async () =>
            (await tdb.db.selectFrom('outbox').select('id').where('tenant_id', '=', 'tenant-b').execute())
              .length === 0,
          30_000,
        );
        expect(relay.stats().parked).toBe(1);
      } finally {
        await relay.stop();
        await run.catch(() => {});
        await tdb.db.deleteFrom('outbox').execute();
        await tdb.db.deleteFrom('outbox_parked_key').execute();
      }
    },
  );
});

/**
 * Review: a tenant's own outbox row naming a topic the broker cannot have (here one that
 * collides with an existing topic by '.' and '_', which auto-creation refuses; the same with
 * auto-creation off and any missing topic) failed every batch with UNKNOWN_TOPIC_OR_PARTITION,
 * a retriable answer: one relay held every lane for good (20 of 20 other messages unsent after
 * 20 s). Now each topic of such a batch is sent on its own, and the missing topic's key parked.
 */
/** Runs a relay with `options` until no outbox row matches `left` (30 s), then stops it. */
async function relayUntilSent(
  options: Partial<RelayOptions>,
  left: (
    q: SelectQueryBuilder<Database, 'outbox', { id: number }>,
  ) => SelectQueryBuilder<Database, 'outbox', { id: number }>,
): Promise<Relay> {
  const relay = createRelay({
    db: tdb.db,
    publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
    publishRetries: 1,
    maxIdleMs: 20,
    ...options,
  });
  const run = relay.run();
  try {
    await waitFor(
      'the messages of topics the broker has published',
      async () => (await left(tdb.db.selectFrom('outbox').select('id')).execute()).length === 0,
      30_000,
    );
  } finally {
    await relay.stop();
    await run;
  }
  return relay;
}
const parkedOn = (topics: string[]) =>
  tdb.db
    .selectFrom('outbox_parked_key')
    .select(['tenant', 'topic', 'key', 'error'])
    .where('topic', 'in', topics)
    .execute();

describe('a message to a topic the broker does not have', () => {
  it("parks its own key; another tenant's messages on every lane are published", async () => {
    const colliding = topic.replaceAll('.', '_');
    await sql`INSERT INTO outbox (lane, message_id, topic, key, payload)
              VALUES (7, gen_random_uuid(), ${colliding}, 'a-key', '\\x00')`.execute(asA);
    for (let i = 0; i < 20; i++)
      await asB.transaction().execute((t) => outbox.enqueue(t, [{ topic, key: `b${i}`, payload: { i } }]));
    const relay = await relayUntilSent({ instanceId: 'r1' }, (q) => q.where('tenant_id', '=', 'tenant-b'));
    expect(await parkedOn([colliding])).toEqual([
      {
        tenant: 'tenant-a',
        topic: colliding,
        key: 'a-key',
        error: expect.stringMatching(/topic-partition|Unknown topic/),
      },
    ]);
    expect(relay.stats().parked).toBe(1);
    // Its row waits for an operator (create the topic, or skip it), behind its parked key.
    expect(
      await tdb.db.selectFrom('outbox').select('topic').where('tenant_id', '=', 'tenant-a').execute(),
    ).toEqual([{ topic: colliding }]);
  });

  it('a broker back from a restart between two topics of the isolation, its first listing lacking one, parks nothing (review)', async () => {
    const x = await createTestTopic('bad.topic.restart.x', 1);
    const y = await createTestTopic('bad.topic.restart.y', 1);
    for (let i = 0; i < 3; i++)
      await asA.transaction().execute((t) => outbox.enqueue(t, [{ topic: x, key: `a${i}`, payload: { i } }]));
    for (let i = 0; i < 3; i++)
      await asB.transaction().execute((t) => outbox.enqueue(t, [{ topic: y, key: `b${i}`, payload: { i } }]));
    const real = createKafkaPublisher({ brokers: kafkaBrokers() });
    // Restarting, the broker answers so for every topic: the batch, then topic x's group; back for y's.
    let restarting = 2;
    const publisher: Publisher = {
      address: real.address,
      connect: () => real.connect(),
      disconnect: () => real.disconnect(),
      async publish(messages) {
        if (restarting-- > 0) {
          throw Object.assign(new Error('This server does not host this topic-partition'), {
            type: 'UNKNOWN_TOPIC_OR_PARTITION',
            retriable: true,
          });
        }
        return real.publish(messages);
      },
    };
    // With an admin whose first listing, from that broker, lacks x (it has not loaded it yet).
    const real2 = createKafkaAdmin({ brokers: kafkaBrokers() });
    let listings = 0;
    const admin = {
      ...real2,
      listTopics: async () => {
        const all = await real2.listTopics();
        return listings++ === 0 ? all.filter((t) => t !== x) : all;
      },
    };
    try {
      await relayUntilSent({ publisher, admin, instanceId: 'r2', publishRetries: 0 }, (q) =>
        q.where('topic', 'in', [x, y]),
      );
    } finally {
      await real2.close();
    }
    expect(listings).toBeGreaterThan(0);
    expect(await parkedOn([x, y])).toEqual([]);
  });

  it('with the admin given, a batch all of it for the missing topic (more rows than a batch, or one row past its bytes) parks those keys (review)', async () => {
    const colliding = (await createTestTopic('bad.topic.flood', 1)).replaceAll('.', '_');
    for (let i = 0; i < 6; i++)
      await sql`INSERT INTO outbox (lane, message_id, topic, key, payload)
                VALUES (${laneOf(`f${i}`)}, gen_random_uuid(), ${colliding}, ${`f${i}`}, ${Buffer.alloc(i === 0 ? 4000 : 1)})`.execute(
        asA,
      );
    for (let i = 0; i < 20; i++)
      await asB
        .transaction()
        .execute((t) => outbox.enqueue(t, [{ topic, key: `flood-b${i}`, payload: { i } }]));
    const admin = createKafkaAdmin({ brokers: kafkaBrokers() });
    try {
      await relayUntilSent({ admin, instanceId: 'r3', batchSize: 5, maxBatchBytes: 1000 }, (q) =>
        q.where('key', 'like', 'flood-b%'),
      );
    } finally {
      await admin.close();
    }
    expect((await parkedOn([colliding])).map((p) => p.key).sort()).toEqual([
      'f0',
      'f1',
      'f2',
      'f3',
      'f4',
      'f5',
    ]);
  });

  it('a relay whose isolation takes longer than its lease (slow listings) keeps its lanes to the park (review)', async () => {
    const colliding = (await createTestTopic('bad.topic.slow', 1)).replaceAll('.', '_');
    await sql`INSERT INTO outbox (lane, message_id, topic, key, payload)
              VALUES (${laneOf('slow-key')}, gen_random_uuid(), ${colliding}, 'slow-key', '\\x00')`.execute(
      asA,
    );
    const real = createKafkaAdmin({ brokers: kafkaBrokers() });
    // Each listing takes 1.2 s (within its 5 s deadline): two of them outlast the 2 s lease.
    const admin = {
      ...real,
      listTopics: async () => {
        await new Promise((r) => setTimeout(r, 1200));
        return real.listTopics();
      },
    };
    const atPark: Array<{ owner: string | null; live: boolean }> = [];
    const relay = createRelayWithTestHooks(
      {
        db: tdb.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        admin,
        instanceId: 'r4',
        leaseTtlMs: 2000,
        publishRetries: 0,
      },
      {
        beforePark: async () => {
          const { rows } = await sql<{ owner: string | null; live: boolean }>`
            SELECT owner, expires_at > now() AS live FROM relay_lane WHERE lane = ${laneOf('slow-key')}`.execute(
            tdb.db,
          );
          atPark.push(rows[0]!);
        },
      },
    );
    const run = relay.run();
    try {
      await waitFor('the key to be parked', async () => (await parkedOn([colliding])).length > 0, 30_000);
    } finally {
      await relay.stop();
      await run;
      await real.close();
    }
    // Observed before: the lease had run out under the relay still isolating (live: false),
    // free for another relay to take while this one was about to park.
    expect(atPark[0]).toEqual({ owner: 'r4', live: true });
  });
});
