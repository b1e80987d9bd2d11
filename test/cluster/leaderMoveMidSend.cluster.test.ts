import { Partitioners } from 'kafkajs';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import {
  clusterBrokers,
  clusterNodes,
  startLocalCluster,
  stopLocalCluster,
} from '../../cli/stack/cluster.js';
import { createRelay } from '../../relay/index.js';
import { createKafkaPublisher, kafkaClient, type Publisher } from '../../src/kafka/publisher.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { everyNodeAgrees } from '../support/clusterProbe.js';
import { createTestDatabase, type TestDatabase, uniqueTopic } from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';

// The order violation brokerFailure.cluster.test.ts found once (one key's first copies on the
// topic: n 0-9, 27-39, 10-26), made deterministic. kafkajs's sendBatch keeps, across its own
// retries, the answer of each broker that already acknowledged its part. When a partition's
// leadership moves, between two of those retries, to a broker that already answered, the
// retry sends that broker nothing and the send resolves: the moved partition's messages were
// never written, yet the relay was told the batch was acknowledged. Here a partition's leader
// moves (a reassignment, brokers up) while the producer's metadata still names the old one.
// The relay's lane lease also runs out while the batch is published (as it did during the
// outage, where one batch's retries outlast the 10 s lease), so its rows are not deleted and
// are published again after the next batch: the lost messages come back, after later ones.

const local = inject('kafkaLocal');
const SIZE = 3;
const nodes = clusterNodes(SIZE);
const brokers = clusterBrokers(SIZE).split(',');
const kafka = kafkaClient(brokers, 'leader-move-test');
const admin = kafka.admin();
let tdb: TestDatabase;
const log = (line: string) => console.log(`[leader move] ${line}`);

/** A key that the default partitioner puts on `partition` of a two-partition topic. */
function keyOn(partition: number): string {
  const partitioner = Partitioners.DefaultPartitioner();
  const partitionMetadata = [0, 1].map((p) => ({
    partitionErrorCode: 0,
    partitionId: p,
    leader: p + 1,
    replicas: [],
    isr: [],
  }));
  for (let i = 0; ; i++) {
    const key = `k${i}`;
    if (partitioner({ topic: 't', partitionMetadata, message: { key, value: null } }) === partition)
      return key;
  }
}

/** Waits until every node answers that `partition` of `topic` is led by `leader`. */
async function leaderEverywhere(topic: string, partition: number, leader: number): Promise<void> {
  await everyNodeAgrees(
    nodes,
    topic,
    `every broker to name node ${leader} the leader of ${topic}/${partition}`,
    (ps) => ps.find((p) => p.partitionId === partition)?.leader === leader,
  );
}

describe.skipIf(!local)('a partition leader moving to a broker that already answered the same send', () => {
  beforeAll(async () => {
    await startLocalCluster(SIZE, log);
    await admin.connect();
    tdb = await createTestDatabase('leader_move', { max: 6 });
  }, 300_000);
  afterAll(async () => {
    await admin.disconnect().catch(() => {});
    await tdb?.drop();
    await stopLocalCluster(20_000);
  }, 180_000);

  it('keeps the order of first copies per key, and loses nothing, when kafkajs retries a batch after a leader change', async () => {
    const topic = uniqueTopic('leader-move');
    // Partition 0 led by node 1, partition 1 by node 2: one send goes to two brokers.
    await waitFor(
      `the cluster to create ${topic}`,
      () =>
        admin
          .createTopics({
            topics: [
              {
                topic,
                replicaAssignment: [
                  { partition: 0, replicas: [1, 2, 3] },
                  { partition: 1, replicas: [2, 1, 3] },
                ],
                configEntries: [{ name: 'min.insync.replicas', value: '2' }],
              },
            ],
            waitForLeaders: false,
          })
          .then(
            () => true,
            (err: { type?: string }) => err.type === 'TOPIC_ALREADY_EXISTS',
          ),
      60_000,
    );
    await leaderEverywhere(topic, 0, 1);
    await leaderEverywhere(topic, 1, 2);
    const moving = keyOn(1);
    const staying = keyOn(0);
    const keys = [moving, staying];

    const ttlMs = 1500;
    const real = createKafkaPublisher({ brokers });
    let slowed = false;
    // The first batch that holds n 10 is acknowledged only after the relay's lane leases ran
    // out: what a batch retried through an outage does, here without the outage.
    const publisher: Publisher = {
      address: real.address,
      connect: () => real.connect(),
      disconnect: () => real.disconnect(),
      async publish(messages) {
        await real.publish(messages);
        const first = JSON.parse(messages[0]!.value.toString()) as { n: number };
        if (!slowed && first.n === 10) {
          slowed = true;
          await new Promise((r) => setTimeout(r, ttlMs * 2));
        }
      },
    };
    // 2 keys x 17 rounds: n 10-26 is one batch, n 27-39 the next (claimed ahead).
    const relay = createRelay({ db: tdb.db, publisher, maxIdleMs: 50, batchSize: 34, leaseTtlMs: ttlMs });
    const relayDone = relay.run();
    const outbox = createOutbox();
    const enqueue = (from: number, to: number) =>
      tdb.db.transaction().execute(async (t) => {
        for (let n = from; n < to; n++) {
          await outbox.enqueue(
            t,
            keys.map((key) => ({ topic, key, payload: { key, n } })),
            { tenantId: 'acme' },
          );
        }
      });
    const outboxLeft = async () =>
      (await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox`.execute(tdb.db)).rows[0]!.n;
    try {
      await enqueue(0, 10);
      await waitFor('n 0-9 to be published', async () => (await outboxLeft()) === 0, 60_000);
      // The relay's producer now knows node 2 as the leader of partition 1. Move it to node 1,
      // which leads partition 0, with every broker up.
      await admin.alterPartitionReassignments({
        topics: [{ topic, partitionAssignment: [{ partition: 1, replicas: [1, 3] }] }],
      });
      await leaderEverywhere(topic, 1, 1);
      await enqueue(10, 40);
      await waitFor('n 10-39 to be published', async () => (await outboxLeft()) === 0, 120_000);
    } finally {
      await relay.stop();
      await relayDone;
    }

    const seen = await readTopic(
      kafka,
      topic,
      (ms) => new Set(ms.map((m) => m.headers['cairn-message-id'])).size >= keys.length * 40,
      30_000,
    );
    const order = new Map<string, number[]>();
    const ids = new Set<string>();
    for (const m of [...seen].sort(
      (a, b) => a.partition - b.partition || Number(a.offset) - Number(b.offset),
    )) {
      const id = m.headers['cairn-message-id']!;
      if (ids.has(id)) continue;
      ids.add(id);
      const { key, n } = JSON.parse(m.value) as { key: string; n: number };
      order.set(key, [...(order.get(key) ?? []), n]);
    }
    const expected = Array.from({ length: 40 }, (_, i) => i);
    expect(order.get(staying), `first copies of ${staying} (partition 0)`).toEqual(expected);
    expect(order.get(moving), `first copies of ${moving} (partition 1, whose leader moved)`).toEqual(
      expected,
    );
  });
});
