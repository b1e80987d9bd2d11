import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import {
  type ClusterNode,
  clusterBrokers,
  clusterNodes,
  killNode,
  startLocalCluster,
  startNode,
  stopLocalCluster,
  waitClusterReady,
} from '../../cli/stack/cluster.js';
import { createInboxConsumer, type InboxConsumer } from '../../consumers/inboxConsumer.js';
import { createRelay, type Relay } from '../../relay/index.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { everyNodeAgrees } from '../support/clusterProbe.js';
import { createTestDatabase, type TestDatabase, uniqueTopic } from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';

// Issue 19: a replicated cluster (3 KRaft nodes, replication 3, min.insync.replicas=2) losing
// brokers under the relay and an inbox consumer. Real JVMs, killed with SIGKILL.

const local = inject('kafkaLocal');
if (!local)
  console.warn(
    '[broker failure] skipped: needs the local stack (CAIRN_STACK=local) to start and kill brokers',
  );

const SIZE = 3;
const nodes = clusterNodes(SIZE);
const brokers = clusterBrokers(SIZE).split(',');
const kafka = kafkaClient(brokers, 'broker-failure-test');
const admin = kafka.admin();
let tdb: TestDatabase;
let relay: Relay | undefined;
let relayDone: Promise<void> | undefined;
let consumer: InboxConsumer | undefined;
let consumerDone: Promise<void> | undefined;
let consumerError: unknown;
/** Throws what ended the consumer, so a wait for it fails at once and says why. */
function consumerGaveUp(): false {
  if (consumerError) throw consumerError;
  return false;
}
const log = (line: string) => console.log(`[broker failure] ${line}`);

async function createTopic(label: string): Promise<string> {
  const topic = uniqueTopic(label);
  // A node restarted by the previous test may not be registered again yet: until it is, a
  // replication factor of 3 is refused (INVALID_REPLICATION_FACTOR), so ask again.
  await waitFor(
    `the cluster to create ${topic} with 3 replicas`,
    async () =>
      admin
        .createTopics({
          topics: [
            {
              topic,
              numPartitions: 3,
              replicationFactor: 3,
              configEntries: [{ name: 'min.insync.replicas', value: '2' }],
            },
          ],
          // Waited for below, broker by broker: kafkajs's own wait gives up on the first
          // "does not host this topic-partition" from a broker that has not heard of it yet.
          waitForLeaders: false,
        })
        .then(
          () => true,
          (err: { type?: string }) => {
            if (err.type === 'TOPIC_ALREADY_EXISTS') return true;
            log(`creating ${topic}: ${String(err)}; trying again`);
            return false;
          },
        ),
    60_000,
  );
  // Each broker learns of a new topic from the controller on its own time: until every one lists
  // it with a leader per partition, a client that asks the wrong broker is told it does not exist.
  await everyNodeAgrees(
    nodes,
    topic,
    `every broker to know ${topic}`,
    (ps) => ps.filter((p) => p.leader >= 0).length === 3,
  );
  return topic;
}

/** The node leading partition `p` of `topic` now. */
async function leaderOf(topic: string, p = 0): Promise<ClusterNode> {
  const meta = await admin.fetchTopicMetadata({ topics: [topic] });
  const leader = meta.topics[0]!.partitions.find((x) => x.partitionId === p)!.leader;
  return nodes.find((n) => n.id === leader)!;
}

const outboxLeft = async () =>
  (await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox`.execute(tdb.db)).rows[0]!.n;

/** Enqueues `perKey` messages for each key, n rising per key, one transaction per round. */
async function writeRounds(
  topic: string,
  keys: number,
  rounds: { from: number; to: number },
  pauseMs: number,
  onRound?: (n: number) => Promise<void>,
) {
  const outbox = createOutbox();
  for (let n = rounds.from; n < rounds.to; n++) {
    await tdb.db.transaction().execute((t) =>
      outbox.enqueue(
        t,
        Array.from({ length: keys }, (_, k) => ({ topic, key: `k${k}`, payload: { key: `k${k}`, n } })),
        { tenantId: 'acme' },
      ),
    );
    await onRound?.(n);
    if (pauseMs) await new Promise((r) => setTimeout(r, pauseMs));
  }
}

/** Every message on the topic: each message id once with one payload, and n rising per key without a gap. */
async function checkTopic(topic: string, keys: number, perKey: number) {
  const seen = await readTopic(
    kafka,
    topic,
    (ms) => new Set(ms.map((m) => m.headers['cairn-message-id'])).size >= keys * perKey,
    60_000,
  );
  const byId = new Map<string, string>();
  const order = new Map<string, number[]>();
  let duplicates = 0;
  const byPartition = [...seen].sort(
    (a, b) => a.partition - b.partition || Number(a.offset) - Number(b.offset),
  );
  for (const m of byPartition) {
    const id = m.headers['cairn-message-id']!;
    const before = byId.get(id);
    if (before !== undefined) {
      duplicates++;
      expect(m.value, `duplicate of ${id} with another payload`).toBe(before);
      continue;
    }
    byId.set(id, m.value);
    const { key, n } = JSON.parse(m.value) as { key: string; n: number };
    order.set(key, [...(order.get(key) ?? []), n]);
  }
  expect(byId.size).toBe(keys * perKey);
  for (let k = 0; k < keys; k++) {
    expect(order.get(`k${k}`), `order of key k${k}`).toEqual(Array.from({ length: perKey }, (_, i) => i));
  }
  return { duplicates };
}

describe.skipIf(!local)('a three-broker cluster losing brokers under the relay and an inbox consumer', () => {
  beforeAll(async () => {
    await startLocalCluster(SIZE, log);
    await admin.connect();
    tdb = await createTestDatabase('broker_failure', { max: 12 });
    await sql`CREATE TABLE applied (id bigserial PRIMARY KEY, message_id text NOT NULL, key text NOT NULL, n int NOT NULL)`.execute(
      tdb.db,
    );
  }, 300_000);
  afterAll(async () => {
    await consumer?.stop();
    await relay?.stop();
    await relayDone;
    await admin.disconnect().catch(() => {});
    await tdb?.drop();
    await stopLocalCluster(20_000);
  }, 180_000);

  function startRelayAndConsumer(topic: string) {
    relay = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers }),
      maxIdleMs: 50,
      batchSize: 100,
    });
    relayDone = relay.run();
    const groupId = `${topic}.g`;
    consumer = createInboxConsumer({
      db: tdb.db,
      groupId,
      subscriber: createKafkaSubscriber({ brokers, groupId, topics: [topic] }),
      dlqPublisher: createKafkaPublisher({ brokers }),
      handler: async (trx, m) => {
        const { key, n } = m.json<{ key: string; n: number }>();
        await sql`INSERT INTO applied (message_id, key, n) VALUES (${m.messageId}, ${key}, ${n})`.execute(
          trx,
        );
      },
      maxAttempts: 1000,
      retryBaseMs: 50,
    });
    consumerDone = consumer.run().catch((err: unknown) => {
      consumerError = err;
    });
  }
  async function stopRelayAndConsumer() {
    await consumer?.stop();
    await consumerDone;
    consumer = undefined;
    expect(consumerError, 'the consumer ran to the end').toBeUndefined();
    await relay?.stop();
    await relayDone;
    relay = undefined;
  }
  /** Waits until the consumer applied `n` distinct messages; fails at once if it gave up. */
  async function waitApplied(n: number, deadlineMs: number) {
    const applied = async () =>
      (await sql<{ n: number }>`SELECT count(DISTINCT message_id)::int AS n FROM applied`.execute(tdb.db))
        .rows[0]!.n;
    await waitFor(
      'the consumer to apply every message',
      async () => consumerGaveUp() || (await applied()) >= n,
      deadlineMs,
    );
  }
  async function checkApplied(keys: number, perKey: number) {
    const rows = (
      await sql<{
        key: string;
        n: number;
        message_id: string;
      }>`SELECT key, n, message_id FROM applied ORDER BY id`.execute(tdb.db)
    ).rows;
    expect(new Set(rows.map((r) => r.message_id)).size, 'each message applied once').toBe(rows.length);
    for (let k = 0; k < keys; k++) {
      expect(
        rows.filter((r) => r.key === `k${k}`).map((r) => r.n),
        `applied order of k${k}`,
      ).toEqual(Array.from({ length: perKey }, (_, i) => i));
    }
  }

  it('the leader of a partition SIGKILLed mid-stream: every message delivered and applied once, order per key, duplicates only of the same message id', async () => {
    const topic = await createTopic('leader-kill');
    await sql`TRUNCATE applied`.execute(tdb.db);
    startRelayAndConsumer(topic);
    const KEYS = 12;
    const ROUNDS = 120;
    let killed: ClusterNode | undefined;
    await writeRounds(topic, KEYS, { from: 0, to: ROUNDS }, 20, async (n) => {
      if (n === 40) {
        killed = await leaderOf(topic, 0);
        log(
          `killing node ${killed.id}, the leader of partition 0, with ${await outboxLeft()} rows in the outbox`,
        );
        await killNode(killed);
      }
    });
    await waitFor(
      'the outbox to drain without the killed broker',
      async () => (await outboxLeft()) === 0,
      180_000,
    );
    expect(relay!.stats().parked, 'no key parked for a broker loss').toBe(0);
    await waitApplied(KEYS * ROUNDS, 180_000);
    const newLeader = await leaderOf(topic, 0);
    expect(newLeader.id).not.toBe(killed!.id);
    const { duplicates } = await checkTopic(topic, KEYS, ROUNDS);
    await checkApplied(KEYS, ROUNDS);
    log(
      `leader kill: ${KEYS * ROUNDS} messages, ${duplicates} duplicate records on the topic, relay retries ${relay!.stats().retries}`,
    );
    await stopRelayAndConsumer();
    startNode(killed!);
    await waitClusterReady(nodes, log);
  });

  it('two of three brokers down (below min.insync.replicas): the relay holds every row, parks nothing, and publishes all in order once they are back', async () => {
    const topic = await createTopic('two-down');
    await sql`TRUNCATE applied`.execute(tdb.db);
    startRelayAndConsumer(topic);
    const KEYS = 6;
    await writeRounds(topic, KEYS, { from: 0, to: 10 }, 0);
    await waitFor('the first rounds to be published', async () => (await outboxLeft()) === 0, 60_000);
    const [a, b] = [nodes[0]!, nodes[1]!];
    log(`killing nodes ${a.id} and ${b.id}`);
    await Promise.all([killNode(a), killNode(b)]);
    await writeRounds(topic, KEYS, { from: 10, to: 40 }, 0);
    // While only one broker runs nothing can be acknowledged by two replicas: every row waits.
    const during = Date.now();
    await new Promise((r) => setTimeout(r, 12_000));
    const waiting = await outboxLeft();
    expect(waiting, 'rows still in the outbox while the cluster cannot acknowledge').toBeGreaterThan(0);
    expect(relay!.stats().parked, 'no key parked for a broker loss').toBe(0);
    // What an operator sees meanwhile: the relay says it waits for Kafka (/readyz 503, cairn_relay_waiting_for 1).
    await waitFor(
      'the relay to say it waits for Kafka',
      async () => relay!.stats().waitingFor === 'kafka',
      60_000,
    );
    expect(await sql`SELECT 1 FROM outbox_parked_key`.execute(tdb.db).then((r) => r.rows)).toEqual([]);
    log(
      `${waiting} rows waited for ${((Date.now() - during) / 1000).toFixed(0)} s; restarting nodes ${a.id} and ${b.id}`,
    );
    startNode(a);
    startNode(b);
    await waitClusterReady(nodes, log);
    await waitFor(
      'the outbox to drain once the brokers are back',
      async () => (await outboxLeft()) === 0,
      240_000,
    );
    await waitFor(
      'the relay to stop waiting for Kafka',
      async () => relay!.stats().waitingFor === null,
      60_000,
    );
    await waitApplied(KEYS * 40, 240_000);
    const { duplicates } = await checkTopic(topic, KEYS, 40);
    await checkApplied(KEYS, 40);
    log(
      `two down: ${KEYS * 40} messages, ${duplicates} duplicate records, relay retries ${relay!.stats().retries}`,
    );
    await stopRelayAndConsumer();
  });
});
