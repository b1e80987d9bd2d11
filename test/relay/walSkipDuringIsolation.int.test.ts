/**
 * The WAL mode, an operator skipping a refused message while the relay isolates its batch
 * (review of 8439f79). The park then finds no row and parks nothing. Before the fix, the
 * isolation had set the key aside anyway: the batch's later rows of the key stayed in the table,
 * the routing did not hold the key (it holds keys when a park happened), and the key's next
 * streamed message went out at once, ahead of them (p:1, p:4; p:3 left in the table).
 */
import { describe, expect, it } from 'vitest';
import { createRelayWithTestHooks } from '../../relay/relay.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { skipMessage } from '../../src/outbox/operator.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { pausePoint } from '../support/pausePoint.js';
import { createTestTopic, kafkaBrokers } from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';
import { useLogicalServer } from '../support/walServer.js';

const kafka = kafkaClient(kafkaBrokers(), 'wal-skip-during-isolation');
const outbox = createOutbox();
const wal = useLogicalServer('walskip');

describe('the WAL mode, a refused message skipped while its batch is isolated', () => {
  it('the key is not parked and its order holds: the batch goes on, then its next message', async () => {
    const d = await wal.database('skip');
    const topic = await createTestTopic('wal-skip-isolation', 1, { 'max.message.bytes': '1024' });
    const atPark = pausePoint();
    const relay = createRelayWithTestHooks(
      {
        db: d.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        maxIdleMs: 50,
        leaseTtlMs: 3000,
        wal: { connectionString: d.url, slot: d.slot, sweepEveryMs: 300 },
      },
      { beforePark: () => atPark.hold() },
    );
    wal.start(relay);
    await waitFor('the stream to start', async () => wal.streaming(relay), 30_000);
    const m = (key: string, n: number, bytes = 0) => ({
      topic,
      key,
      payload: Buffer.from(`${key}:${n}`.padEnd(bytes, ' ')),
    });
    const [, refused] = await d.db
      .transaction()
      .execute((t) => outbox.enqueue(t, [m('p', 1), m('p', 2, 4000), m('p', 3), m('h', 1)]));
    await atPark.reached; // p:2 refused in the isolation; about to park p
    await skipMessage(d.db, {
      messageId: refused!,
      actor: 'spiffe://cairn.test/operator',
      reason: 'too large',
    });
    atPark.release();
    await readTopic(kafka, topic, (ms) => ms.some((x) => x.value.trim() === 'h:1'), 15_000);
    await d.db.transaction().execute((t) => outbox.enqueue(t, [m('p', 4)]));
    const got = await readTopic(kafka, topic, (ms) => ms.some((x) => x.value.trim() === 'p:4'), 15_000);
    expect(got.map((x) => x.value.trim()).filter((v) => v.startsWith('p'))).toEqual(['p:1', 'p:3', 'p:4']);
    expect(relay.stats().parked).toBe(0);
  });
});
