import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { replayDeadLetter } from '../../consumers/deadLetters.js';
import type { InboxHandler } from '../../consumers/inboxConsumer.js';
import { createKafkaPublisher, type Publisher } from '../../src/kafka/publisher.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { dlqHarness } from './dlqHarness.js';
import { produceTo, uuid } from './fixtures.js';

/**
 * Replaying the dead letter of a message the inbox could not store (dlqRefused.int): it is
 * recorded under `cairn-offset:<topic>:<partition>:<offset>`, an id no other message may take;
 * its replayed copy is applied once, whatever the replay's process does meanwhile.
 */
let tdb: TestDatabase;
beforeAll(async () => {
  tdb = await createTestDatabase('inbox_dlq_replay');
  await sql`CREATE TABLE seen (seq int NOT NULL)`.execute(tdb.db);
  await sql`CREATE TABLE seen_as (seq int NOT NULL, tenant text)`.execute(tdb.db);
});
afterAll(async () => {
  await tdb?.drop();
});

const { recordSeq, seenFrom, withConsumer } = dlqHarness(() => tdb);

describe('a dead letter recorded under its coordinates', () => {
  /**
   * Review: such a letter was stored with no tenant, but a replay resent its stored headers, so
   * the copy was applied as the tenant they named; a second replay looked for an applied row
   * with no tenant, found none and sent it again (after the inbox's prune, a second run).
   */
  it('replaying one: an unstorable id keeps its tenant, and a second replay is refused as applied; an unstorable tenant is not replayed as anyone', async () => {
    const topic = await createTestTopic('inbox-dlq-replay-identity', 1);
    await produceTo(topic, [
      {
        key: 'k',
        value: JSON.stringify({ seq: 41 }),
        headers: { 'cairn-message-id': 'id\u0000nul', 'cairn-tenant': 'acme' },
      },
      {
        key: 'k',
        value: JSON.stringify({ seq: 42 }),
        headers: { 'cairn-message-id': uuid(), 'cairn-tenant': 'acme\u0000x' },
      },
    ]);
    const groupId = `${topic}.g`;
    const handler: InboxHandler = async (trx, m) => {
      await sql`INSERT INTO seen_as (seq, tenant) VALUES (${m.json<{ seq: number }>().seq}, ${m.tenantId ?? null})`.execute(
        trx,
      );
    };
    // The replaying process slow between the broker's ack and its commit (a pause, a busy
    // host): the copy is read first, and must wait for the commit (review).
    const slowAfterAck = (): Publisher => {
      const real = createKafkaPublisher({ brokers: kafkaBrokers() });
      return {
        address: real.address,
        connect: () => real.connect(),
        disconnect: () => real.disconnect(),
        async publish(ms) {
          await real.publish(ms);
          await new Promise((r) => setTimeout(r, 1000));
        },
      };
    };
    const replay = (messageId: string, tenantId?: string) =>
      replayDeadLetter(tdb.db, slowAfterAck(), {
        messageId,
        groupId,
        ...(tenantId !== undefined && { tenantId }),
      });
    await withConsumer(topic, groupId, handler, 2, async (consumer) => {
      await waitFor('two dead letters', () => consumer.stats().deadLettered === 2, 30_000);
      const rows = await tdb.db
        .selectFrom('inbox_dlq')
        .select(['message_id', 'tenant_id'])
        .where('consumer_group', '=', groupId)
        .orderBy('offset')
        .execute();
      expect(rows.map((r) => [r.message_id, r.tenant_id])).toEqual([
        [`cairn-offset:${topic}:0:0`, 'acme'],
        [`cairn-offset:${topic}:0:1`, null],
      ]);

      await replay(`cairn-offset:${topic}:0:0`, 'acme');
      await waitFor('the replayed copy applied', () => consumer.stats().applied === 1, 30_000);
      await expect(replay(`cairn-offset:${topic}:0:0`, 'acme')).rejects.toMatchObject({
        code: 'already_applied',
      });

      await expect(replay(`cairn-offset:${topic}:0:1`)).rejects.toThrow(/cairn-tenant/);
      await new Promise((r) => setTimeout(r, 1000)); // a copy sent anyway would be applied meanwhile
      expect(consumer.stats().applied).toBe(1);
      const seen = await sql<{
        seq: number;
        tenant: string | null;
      }>`SELECT seq, tenant FROM seen_as ORDER BY seq`.execute(tdb.db);
      expect(seen.rows).toEqual([{ seq: 41, tenant: 'acme' }]);
    });
  });

  it('no message takes the id of the dead letter at another offset (review: the letter was dropped as applied)', async () => {
    const topic = await createTestTopic('inbox-dlq-collide', 1);
    const coords = (offset: number) => `cairn-offset:${topic}:0:${offset}`;
    await produceTo(topic, [
      // An id of the form a message without one is applied under: a message's own choice.
      {
        key: 'k',
        value: JSON.stringify({ seq: 50 }),
        headers: { 'cairn-message-id': `${topic}:0:2`, 'cairn-tenant': 'acme' },
      },
      // The id of the dead letter at offset 2: refused as its own (dead-lettered at offset 1).
      {
        key: 'k',
        value: JSON.stringify({ seq: 51 }),
        headers: { 'cairn-message-id': coords(2), 'cairn-tenant': 'acme' },
      },
      {
        key: 'k',
        value: JSON.stringify({ seq: 52 }),
        headers: { 'cairn-message-id': 'id\u0000nul', 'cairn-tenant': 'acme' },
      },
      {
        key: 'k',
        value: JSON.stringify({ seq: 53 }),
        headers: { 'cairn-message-id': uuid(), 'cairn-tenant': 'acme' },
      },
    ]);
    const groupId = `${topic}.g`;
    await withConsumer(topic, groupId, recordSeq, 2, async (consumer) => {
      await waitFor(
        'two applied, two dead-lettered',
        () => consumer.stats().applied === 2 && consumer.stats().deadLettered === 2,
        30_000,
      );
      expect(await seenFrom(50)).toEqual([50, 53]);
      const dlq = await tdb.db
        .selectFrom('inbox_dlq')
        .select(['message_id', 'tenant_id', 'error'])
        .where('consumer_group', '=', groupId)
        .orderBy('offset')
        .execute();
      expect(dlq.map((r) => [r.message_id, r.tenant_id])).toEqual([
        [coords(1), 'acme'],
        [coords(2), 'acme'],
      ]);
      expect(dlq[0]!.error).toMatch(/starts with cairn-offset:/);
    });
  });

  it('a replay that rolls back after the broker took its copy (killed, or past its deadline): the copy is dropped, the letter stays one, and replaying it again applies it once (review)', async () => {
    const topic = await createTestTopic('inbox-dlq-replay-rollback', 1);
    await produceTo(topic, [
      {
        key: 'k',
        value: JSON.stringify({ seq: 61 }),
        headers: { 'cairn-message-id': 'id\u0000nul', 'cairn-tenant': 'acme' },
      },
    ]);
    const groupId = `${topic}.g`;
    const letter = `cairn-offset:${topic}:0:0`;
    // Sends the copy, then fails before the replay commits (as a kill or the deadline would).
    const cutAfterAck = (): Publisher => {
      const real = createKafkaPublisher({ brokers: kafkaBrokers() });
      return {
        address: real.address,
        connect: () => real.connect(),
        disconnect: () => real.disconnect(),
        async publish(ms) {
          await real.publish(ms);
          throw new Error('killed after the ack (test)');
        },
      };
    };
    await withConsumer(topic, groupId, recordSeq, 2, async (consumer) => {
      await waitFor('the dead letter', () => consumer.stats().deadLettered === 1, 30_000);
      await expect(
        replayDeadLetter(tdb.db, cutAfterAck(), { messageId: letter, groupId, tenantId: 'acme' }),
      ).rejects.toThrow(/killed after the ack/);
      await waitFor('the copy dropped as a duplicate', () => consumer.stats().duplicates === 1, 30_000);
      expect(consumer.stats().deadLettered).toBe(1);
      const letters = async () =>
        tdb.db
          .selectFrom('inbox_dlq')
          .select(['message_id', 'replayed_at'])
          .where('consumer_group', '=', groupId)
          .execute();
      expect(await letters()).toEqual([{ message_id: letter, replayed_at: null }]);
      await replayDeadLetter(tdb.db, createKafkaPublisher({ brokers: kafkaBrokers() }), {
        messageId: letter,
        groupId,
        tenantId: 'acme',
      });
      await waitFor('the copy applied', () => consumer.stats().applied === 1, 30_000);
      expect(await seenFrom(61)).toEqual([61]);
      expect((await letters()).length).toBe(1);
    });
  });

  it("a message under an open letter's id, once the inbox pruned the letter's row, is refused: it is not applied in the letter's place, and the letter is replayed after (review)", async () => {
    const topic = await createTestTopic('inbox-dlq-pruned-letter', 1);
    await produceTo(topic, [
      {
        key: 'k',
        value: JSON.stringify({ seq: 71 }),
        headers: { 'cairn-message-id': 'id\u0000nul', 'cairn-tenant': 'acme' },
      },
    ]);
    const groupId = `${topic}.g`;
    const letter = `cairn-offset:${topic}:0:0`;
    await withConsumer(topic, groupId, recordSeq, 2, async (consumer) => {
      await waitFor('the dead letter', () => consumer.stats().deadLettered === 1, 30_000);
      await tdb.db.deleteFrom('inbox').where('consumer_group', '=', groupId).execute(); // as pruneInbox after 7 days
      await produceTo(topic, [
        {
          key: 'k',
          value: JSON.stringify({ seq: 72 }),
          headers: { 'cairn-message-id': letter, 'cairn-tenant': 'acme' },
        },
      ]);
      await waitFor('the forgery dead-lettered', () => consumer.stats().deadLettered === 2, 30_000);
      expect(await seenFrom(71)).toEqual([]);
      await replayDeadLetter(tdb.db, createKafkaPublisher({ brokers: kafkaBrokers() }), {
        messageId: letter,
        groupId,
        tenantId: 'acme',
      });
      await waitFor('the letter applied', () => consumer.stats().applied === 1, 30_000);
      expect(await seenFrom(71)).toEqual([71]);
    });
  });

  /**
   * Review: a key the inbox could not keep as it came (a NUL byte, stored as U+FFFD; bytes that
   * are not UTF-8, which the client already decodes so) was replayed under the stored key: a
   * different key, so another partition, after the messages of its own key that followed it.
   */
  it('a letter whose key was not stored as it came (a NUL byte, bytes that are not UTF-8) is not replayed under another key; nothing is sent or marked', async () => {
    const topic = await createTestTopic('inbox-dlq-replay-key', 1);
    const ids = [uuid(), uuid(), uuid()];
    await produceTo(topic, [
      { key: 'k\u0000nul', value: JSON.stringify({ seq: 91 }), headers: { 'cairn-message-id': ids[0]! } },
      // 'k' then 0xff: not UTF-8; the handler refuses it, so it is dead-lettered after its attempts.
      {
        key: Buffer.from([0x6b, 0xff]),
        value: JSON.stringify({ seq: 92 }),
        headers: { 'cairn-message-id': ids[1]! },
      },
      { key: 'k', value: JSON.stringify({ seq: 93 }), headers: { 'cairn-message-id': ids[2]! } },
    ]);
    const groupId = `${topic}.g`;
    const handler: InboxHandler = async (trx, m) => {
      if (m.key !== 'k') throw new Error(`key ${JSON.stringify(m.key)} refused by this handler`);
      await sql`INSERT INTO seen (seq) VALUES (${m.json<{ seq: number }>().seq})`.execute(trx);
    };
    await withConsumer(topic, groupId, handler, 2, async (consumer) => {
      await waitFor(
        'two dead letters, one applied',
        () => consumer.stats().deadLettered === 2 && consumer.stats().applied === 1,
        30_000,
      );
      for (const id of ids.slice(0, 2)) {
        await expect(
          replayDeadLetter(tdb.db, createKafkaPublisher({ brokers: kafkaBrokers() }), {
            messageId: id,
            groupId,
          }),
        ).rejects.toThrow(/key holds U\+FFFD.*not stored as it came.*nothing was sent/);
      }
      const letters = await tdb.db
        .selectFrom('inbox_dlq')
        .select(['message_id', 'replayed_at'])
        .where('consumer_group', '=', groupId)
        .execute();
      expect(letters.map((l) => l.replayed_at)).toEqual([null, null]);
      const inbox = await tdb.db
        .selectFrom('inbox')
        .select('outcome')
        .where('consumer_group', '=', groupId)
        .where('message_id', 'in', ids.slice(0, 2))
        .execute();
      expect(inbox.map((r) => r.outcome)).toEqual(['dead_lettered', 'dead_lettered']);
      await new Promise((r) => setTimeout(r, 1000)); // a copy sent anyway would be read meanwhile
      expect(consumer.stats().deadLettered).toBe(2);
      expect(await seenFrom(91)).toEqual([93]);
    });
  });
});
