import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { signalLocalKafka } from '../../cli/stack/kafka.js';
import { replayDeadLetter } from '../../consumers/deadLetters.js';
import { insertInboxRows } from '../../consumers/sql/insertInboxRows.js';
import { UnavailableError } from '../../src/errors.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { deadLetter } from '../console/fixtures.js';
import { twoTenants } from '../support/tenants.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { readTopic } from '../support/topicReader.js';
import { uuid } from './fixtures.js';

// A replay publishes while it holds the dead letter's rows (so a broker that is down leaves the
// letter unreplayed). A broker that is slow, not dead (frozen here with SIGSTOP), must not make
// it hold them past a consumer's session: a consumer that got the copy waits on the inbox row.
// A chaos test: it freezes the local stack's broker, so it runs alone.

const local = inject('kafkaLocal');
if (!local)
  console.warn('[replay deadline] skipped: needs the local stack (CAIRN_STACK=local) to freeze its broker');

let tdb: TestDatabase;
beforeAll(async () => {
  tdb = await createTestDatabase('replay_deadline');
  const { app } = await twoTenants(tdb);
  await app.destroy();
});
afterAll(async () => {
  await tdb?.drop();
});

describe.skipIf(!local)('a dead-letter replay while the broker is frozen', () => {
  it('gives up within its deadline (unavailable), leaves the letter unreplayed, lets a waiting consumer go on, and works once the broker is back', async () => {
    const topic = await createTestTopic('replay-deadline', 1);
    const messageId = uuid();
    await deadLetter(tdb.db, { groupId: 'billing', topic, messageId, tenantId: 'tenant-a' });
    const publisher = createKafkaPublisher({ brokers: kafkaBrokers() });
    await publisher.connect(); // connected while the broker answers: the freeze hits the publish itself
    const startedAt = Date.now();
    signalLocalKafka('SIGSTOP');
    let consumerDone: number | undefined;
    try {
      const replay = replayDeadLetter(tdb.db, publisher, {
        messageId,
        groupId: 'billing',
        tenantId: 'tenant-a',
      });
      // A consumer that received the copy inserts its inbox row meanwhile: it waits on the replay's lock.
      await new Promise((r) => setTimeout(r, 500));
      const consumer = tdb.db
        .transaction()
        .execute((trx) =>
          insertInboxRows(trx, 'billing', [
            { messageId, tenantId: 'tenant-a', topic, partition: 0, offset: '0', key: 'k1' },
          ]),
        )
        .then((fresh) => {
          consumerDone = Date.now() - startedAt;
          return fresh;
        });
      await expect(replay).rejects.toThrow(UnavailableError);
      const tookMs = Date.now() - startedAt;
      expect(tookMs, 'the replay held the rows no longer than its deadline').toBeLessThan(9_000);
      // The dead-lettered row is still there: the consumer's copy is a duplicate, not applied.
      expect((await consumer).size).toBe(0);
      expect(consumerDone!).toBeLessThan(9_000);
    } finally {
      signalLocalKafka('SIGCONT');
    }
    const dl = await tdb.db
      .selectFrom('inbox_dlq')
      .select('replayed_at')
      .where('message_id', '=', messageId)
      .executeTakeFirstOrThrow();
    expect(dl.replayed_at).toBeNull();
    expect(
      await tdb.db.selectFrom('inbox').select('outcome').where('message_id', '=', messageId).execute(),
    ).toEqual([{ outcome: 'dead_lettered' }]);
    // Once the broker answers again the same replay goes through.
    await replayDeadLetter(tdb.db, createKafkaPublisher({ brokers: kafkaBrokers() }), {
      messageId,
      groupId: 'billing',
      tenantId: 'tenant-a',
    });
    const seen = await readTopic(
      kafkaClient(kafkaBrokers(), 'replay-deadline'),
      topic,
      (ms) => ms.length >= 1,
      60_000,
    );
    expect(seen.map((m) => m.headers['cairn-message-id'])).toContain(messageId);
  });
});
