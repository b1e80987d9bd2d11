import { afterAll, describe, expect, it } from 'vitest';
import { createRelay } from '../../relay/relay.js';
import { keyPartition } from '../../src/kafka/keyPartition.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase, uniqueTopic } from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';

// Review finding: kafkajs sends every partition a broker leads in one produce request. When one
// partition refuses (MESSAGE_TOO_LARGE), the broker still writes the others, yet kafkajs throws
// and (idempotent producer) rolls back the sequence numbers of every partition of the request.
// The relay's one-by-one search then sent an already-written partition's first message with a
// used sequence (OUT_OF_ORDER_SEQUENCE_NUMBER, not a refusal), gave up, reconnected and sent the
// whole batch again: the good partitions were written again, forever.

const PARTITIONS = 3;
const kafka = kafkaClient(kafkaBrokers(), 'too-large-among-partitions-test');
const outbox = createOutbox();
const dbs: TestDatabase[] = [];
afterAll(async () => {
  for (const d of dbs) await d.drop();
});

/** Keys named `${prefix}N` until one lands on a partition `accept` takes. */
function keyWhere(prefix: string, accept: (partition: number) => boolean): string {
  for (let i = 0; ; i++) {
    const key = `${prefix}${i}`;
    if (accept(keyPartition(Buffer.from(key), PARTITIONS))) return key;
  }
}

describe('a message over the topic max.message.bytes among messages for other partitions', () => {
  it('parks its own key only; every other message reaches the topic exactly once, in order per key', async () => {
    const tdb = await createTestDatabase('too_large_partitions');
    dbs.push(tdb);
    const topic = uniqueTopic('too-large-partitions');
    const admin = kafka.admin();
    await admin.connect();
    try {
      await admin.createTopics({
        topics: [
          {
            topic,
            numPartitions: PARTITIONS,
            configEntries: [{ name: 'max.message.bytes', value: '1024' }],
          },
        ],
        waitForLeaders: true,
      });
    } finally {
      await admin.disconnect();
    }
    const a = keyWhere('a', () => true);
    const pa = keyPartition(Buffer.from(a), PARTITIONS);
    const big = keyWhere('big', (p) => p !== pa);
    const b = keyWhere('b', (p) => p === keyPartition(Buffer.from(big), PARTITIONS));
    const m = (key: string, n: number, bytes = 10) => ({
      topic,
      key,
      payload: Buffer.from(`${n}:`.padEnd(bytes, 'x')),
    });
    // One transaction, so one claim: the big one is neither first nor alone in its request.
    const ids = await tdb.db
      .transaction()
      .execute((t) => outbox.enqueue(t, [m(a, 1), m(b, 2), m(big, 3, 4000), m(a, 4), m(b, 5), m(a, 6)]));
    const poison = ids[2]!;
    const healthy = ids.filter((id) => id !== poison);

    const relay = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      maxIdleMs: 50,
      publishRetries: 1,
    });
    const run = relay.run();
    try {
      await waitFor(
        'only the big message to be left in the outbox',
        async () => (await tdb.db.selectFrom('outbox').select('message_id').execute()).length === 1,
        20_000,
      ).catch(() => {});
      // The relay keeps going: a message enqueued afterwards is published too.
      const [later] = await tdb.db.transaction().execute((t) => outbox.enqueue(t, [m(a, 7)]));
      healthy.push(later!);
      await waitFor(
        'the later message to be published',
        async () => (await tdb.db.selectFrom('outbox').select('message_id').execute()).length === 1,
        15_000,
      ).catch(() => {});

      // Every offset written, across the partitions: nothing written twice.
      const reader = kafka.admin();
      await reader.connect();
      const offsets = await reader.fetchTopicOffsets(topic).finally(() => reader.disconnect());
      const written = offsets.reduce((n, o) => n + Number(o.high), 0);
      const delivered = await readTopic(kafka, topic, (ms) => ms.length >= written, 15_000);
      expect(delivered.map((d) => d.headers['cairn-message-id']).sort()).toEqual([...healthy].sort());
      expect(written).toBe(healthy.length);
      const left = await tdb.db.selectFrom('outbox').select('message_id').execute();
      expect(left.map((r) => r.message_id)).toEqual([poison]);
      const parked = await tdb.db.selectFrom('outbox_parked_key').select(['key', 'message_id']).execute();
      expect(parked).toEqual([{ key: big, message_id: poison }]);

      for (const key of [a, b]) {
        const ofKey = delivered.filter((d) => d.key === key).map((d) => d.headers['cairn-message-id']);
        expect(ofKey, `order of ${key}`).toEqual(healthy.filter((id) => ofKey.includes(id)));
      }
    } finally {
      await relay.stop();
      await run.catch(() => {});
    }
  });
});
