import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { replayDeadLetter } from '../../consumers/deadLetters.js';
import { createInboxConsumer, type InboxConsumer, type InboxHandler } from '../../consumers/inboxConsumer.js';
import { recordDeadLetter } from '../../consumers/sql/recordDeadLetter.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { createEffectsTable, produceTo, uuid } from './fixtures.js';

// Issue 14.1: an operator who runs `cairn inbox replay` twice must not get the effect twice,
// and an applied inbox row never becomes un-applied (not by a late dead letter, not by hand).

const kafka = kafkaClient(kafkaBrokers(), 'replay-twice-test');
const admin = kafka.admin();
let tdb: TestDatabase;
let consumer: InboxConsumer | undefined;

beforeAll(async () => {
  tdb = await createTestDatabase('replay_twice');
  await createEffectsTable(tdb.db);
  await sql`CREATE TABLE fixed (ok boolean)`.execute(tdb.db);
  await admin.connect();
});
afterEach(async () => {
  await consumer?.stop();
  consumer = undefined;
});
afterAll(async () => {
  await admin.disconnect();
  await tdb.drop();
});

/** Offset of the next message to be written to partition 0 (every write was acked with acks=-1). */
async function highWatermark(topic: string): Promise<number> {
  const [p] = await admin.fetchTopicOffsets(topic);
  return Number(p!.high);
}

/** The offset the group committed on partition 0 (-1 before its first commit). */
async function committed(groupId: string, topic: string): Promise<number> {
  const [t] = await admin.fetchOffsets({ groupId, topics: [topic] });
  return Number(t!.partitions[0]!.offset);
}

async function effectsOf(messageId: string): Promise<number> {
  const { rows } = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM effects WHERE message_id = ${messageId}`.execute(tdb.db);
  return rows[0]!.n;
}

async function inboxRow(groupId: string, messageId: string) {
  return tdb.db
    .selectFrom('inbox')
    .select('outcome')
    .where('consumer_group', '=', groupId)
    .where('message_id', '=', messageId)
    .execute();
}

describe('issue 14.1: replaying a dead letter', () => {
  it('a second replay of a dead letter the group has applied is refused (already_applied): nothing is republished and the effect happens once', async () => {
    const topic = await createTestTopic('replay-twice', 1);
    const groupId = `${topic}.g`;
    const poisonId = uuid();
    await produceTo(topic, [
      {
        key: 'p',
        value: JSON.stringify({ key: 'p', seq: 1, poison: true }),
        headers: { 'cairn-message-id': poisonId },
      },
      { key: 'p', value: JSON.stringify({ key: 'p', seq: 2 }), headers: { 'cairn-message-id': uuid() } },
    ]);

    const handler: InboxHandler = async (trx, m) => {
      const body = m.json<{ key: string; seq: number; poison?: boolean }>();
      const fixed = await sql<{ ok: boolean }>`SELECT ok FROM fixed`.execute(trx);
      if (body.poison && !fixed.rows[0]?.ok)
        throw Object.assign(new Error('seq 1 is malformed'), { retriable: false });
      await sql`INSERT INTO effects (message_id, key, seq, consumer) VALUES (${m.messageId}, ${body.key}, ${body.seq}, 'replay')`.execute(
        trx,
      );
    };
    const c = createInboxConsumer({
      db: tdb.db,
      groupId,
      subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId, topics: [topic] }),
      dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      handler,
      maxAttempts: 2,
      retryBaseMs: 10,
    });
    consumer = c;
    void c.run();
    await waitFor(
      'the poison to be dead-lettered and seq 2 applied',
      () => c.stats().deadLettered === 1 && c.stats().applied === 1,
      30_000,
    );

    await sql`INSERT INTO fixed VALUES (true)`.execute(tdb.db);
    await replayDeadLetter(tdb.db, createKafkaPublisher({ brokers: kafkaBrokers() }), {
      messageId: poisonId,
      groupId,
    });
    await waitFor('the replayed copy to be applied', async () => (await effectsOf(poisonId)) === 1, 30_000);
    const afterFirstReplay = await highWatermark(topic); // original 2 messages + 1 replayed copy

    // The operator runs the same command again.
    const second = await replayDeadLetter(tdb.db, createKafkaPublisher({ brokers: kafkaBrokers() }), {
      messageId: poisonId,
      groupId,
    }).then(
      () => 'republished',
      (err: unknown) => err,
    );
    // Let the consumer drain whatever is on the topic now, so a second copy would have been applied.
    const end = await highWatermark(topic);
    await waitFor(
      'the group to commit up to the end of the topic',
      async () => (await committed(groupId, topic)) >= end,
      30_000,
    );

    expect(await effectsOf(poisonId)).toBe(1);
    expect(end).toBe(afterFirstReplay);
    expect(second).toMatchObject({ code: 'already_applied' });
    expect(await inboxRow(groupId, poisonId)).toEqual([{ outcome: 'applied' }]);
  });

  it('a dead letter recorded over a row the group already applied (a revoked consumer finishing its batch) leaves it applied and writes no inbox_dlq row', async () => {
    const groupId = 'late-dlq.g';
    const messageId = uuid();
    await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset")
              VALUES (${groupId}, ${messageId}, 'late-dlq', 0, 7)`.execute(tdb.db);
    const message = {
      messageId,
      topic: 'late-dlq',
      partition: 0,
      offset: '7',
      key: 'k',
      headers: { 'cairn-message-id': messageId },
      value: Buffer.from('{}'),
      tenantId: undefined,
      taskId: undefined,
      taskVersion: undefined,
      taskSeq: 0,
      json: <T>() => ({}) as T,
    };

    await tdb.db
      .transaction()
      .execute((trx) =>
        recordDeadLetter(trx, { groupId, message, error: 'handler failed on the old owner', attempts: 5 }),
      );

    expect(await inboxRow(groupId, messageId)).toEqual([{ outcome: 'applied' }]);
    const dlq = await tdb.db
      .selectFrom('inbox_dlq')
      .select('id')
      .where('message_id', '=', messageId)
      .execute();
    expect(dlq).toEqual([]);
  });

  it('an applied inbox row cannot be deleted or marked dead-lettered by hand-written SQL', async () => {
    const groupId = 'by-hand.g';
    const messageId = uuid();
    await sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset")
              VALUES (${groupId}, ${messageId}, 'by-hand', 0, 3)`.execute(tdb.db);

    const del = await sql`DELETE FROM inbox WHERE consumer_group = ${groupId} AND message_id = ${messageId}`
      .execute(tdb.db)
      .then(
        (r) => `deleted ${r.numAffectedRows} row(s)`,
        (err: unknown) => err,
      );
    const upd =
      await sql`UPDATE inbox SET outcome = 'dead_lettered' WHERE consumer_group = ${groupId} AND message_id = ${messageId}`
        .execute(tdb.db)
        .then(
          (r) => `updated ${r.numAffectedRows} row(s)`,
          (err: unknown) => err,
        );

    expect(await inboxRow(groupId, messageId)).toEqual([{ outcome: 'applied' }]);
    expect(del).toMatchObject({ code: 'CN011', message: expect.stringMatching(/never becomes un-applied/) });
    expect(upd).toMatchObject({ code: 'CN011', message: expect.stringMatching(/never becomes un-applied/) });
  });
});
