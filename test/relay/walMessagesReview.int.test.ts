import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { createDb, type Db } from '../../src/db/database.js';
import { forTenant, registerTenant } from '../../src/db/tenant.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
import { skipMessage } from '../../src/outbox/operator.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { createTestTopic, kafkaBrokers } from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';
import { useLogicalServer, type WalDatabase } from '../support/walServer.js';

// Issue 16, WAL messages: the second adversarial review's findings, each failing before its fix.

const kafka = kafkaClient(kafkaBrokers(), 'wal-messages-review');
const walOutbox = createOutbox({ walMessages: true });
const wal = useLogicalServer('walrev');
const drained = (r: { stats(): { wal?: { streaming: boolean; heldLanes: number } } }) =>
  r.stats().wal?.streaming === true && r.stats().wal?.heldLanes === 0;
const tableRows = async (db: Db) =>
  (await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox`.execute(db)).rows[0]!.n;

/**
 * A relay on `d` with `key` parked (a message the topic refuses) and the slot's position saved
 * right after it, as a checkpoint would: rewind() puts it back there, as a crash would find it,
 * and starts another relay.
 */
async function parkedThenSaved(d: WalDatabase, topic: string, key: string) {
  const first = wal.start(wal.walRelay(d, { instanceId: 'r1' }));
  await waitFor('the stream to start', async () => drained(first), 30_000);
  const poison = randomUUID();
  await sql`INSERT INTO outbox_wal (message_id, topic, key, payload)
            VALUES (${poison}::uuid, ${topic}, ${key}, ${Buffer.alloc(4000, 1)}::bytea)`.execute(d.db);
  await waitFor('the key parked', async () => first.stats().parked === 1, 20_000);
  await sql`SELECT pg_copy_logical_replication_slot(${d.slot}, ${`${d.slot}_bak`})`.execute(d.db);
  return {
    poison,
    async rewind() {
      await first.stop();
      await sql`SELECT pg_drop_replication_slot(${d.slot})`.execute(d.db);
      await sql`SELECT pg_copy_logical_replication_slot(${`${d.slot}_bak`}, ${d.slot})`.execute(d.db);
      await sql`SELECT pg_drop_replication_slot(${`${d.slot}_bak`})`.execute(d.db);
      const again = wal.start(wal.walRelay(d, { instanceId: 'r2' }));
      await waitFor('the stream to start', async () => drained(again), 30_000);
    },
  };
}
const operator = { actor: 'spiffe://cairn.test/operator', reason: 'do not send' };

describe('issue 16: WAL messages, second review', () => {
  it("a tenant's message with a task_version past 2^53 is refused at write (it could never be moved into the table: the stream held for everyone)", async () => {
    const d = await wal.database('tv');
    const topic = await createTestTopic('walrev-tv', 1, { 'max.message.bytes': '1024' });
    await registerTenant(d.db, 'tenant-a');
    const u = new URL(d.url);
    u.username = 'cairn_app';
    const app = createDb({ connectionString: u.toString(), max: 2 });
    try {
      const relay = wal.start(wal.walRelay(d));
      await waitFor('the stream to start', async () => drained(relay), 30_000);
      await expect(
        sql`INSERT INTO outbox_wal (message_id, topic, key, task_version, payload)
            VALUES (gen_random_uuid(), ${topic}, 'a-key', 9223372036854775807, ${Buffer.alloc(4000, 1)}::bytea)`.execute(
          forTenant(app, 'tenant-a'),
        ),
      ).rejects.toThrow(/out of range/);
    } finally {
      await app.destroy();
    }
  }, 60_000);

  it('a publication dropped by hand: the relay drops and makes again a slot that held messages, and says messages may be lost (writers refused meanwhile)', async () => {
    const d = await wal.database('pub');
    const topic = await createTestTopic('walrev-pub', 1);
    const relay = wal.start(wal.walRelay(d));
    await waitFor('the stream to start', async () => drained(relay), 30_000);
    await d.db
      .transaction()
      .execute((t) => walOutbox.enqueue(t, [{ topic, key: 'k', payload: Buffer.from('m:0') }]));
    await readTopic(kafka, topic, (xs) => xs.some((x) => x.value === 'm:0'), 20_000);
    await sql`DROP PUBLICATION cairn_outbox`.execute(d.db);
    await sql`CREATE TABLE junk (x int)`.execute(d.db);
    // Any table change decoded after the drop breaks the stream for good at that point.
    await d.db.transaction().execute(async (t) => {
      await sql`INSERT INTO junk VALUES (1)`.execute(t);
      await walOutbox.enqueue(t, [{ topic, key: 'k', payload: Buffer.from('m:1') }]);
    });
    await waitFor('the loss reported', async () => relay.stats().wal?.messagesMaybeLost === 1, 30_000);
    await waitFor('streaming again', async () => drained(relay), 30_000);
    await d.db
      .transaction()
      .execute((t) => walOutbox.enqueue(t, [{ topic, key: 'k', payload: Buffer.from('m:2') }]));
    await readTopic(kafka, topic, (xs) => xs.some((x) => x.value === 'm:2'), 30_000);
  }, 120_000);

  it('an operator skip of a moved message holds when the slot delivers it again (its position saved at a checkpoint before: a Postgres crash goes back to it)', async () => {
    const d = await wal.database('skip');
    const topic = await createTestTopic('walrev-skip', 1, { 'max.message.bytes': '1024' });
    const { poison, rewind } = await parkedThenSaved(d, topic, 'p');
    const [held] = await d.db
      .transaction()
      .execute((t) => walOutbox.enqueue(t, [{ topic, key: 'p', payload: Buffer.from('p:2') }]));
    await waitFor(
      'p:2 moved into the table behind the parked key',
      async () => (await tableRows(d.db)) === 2,
      20_000,
    );
    // The operator drops both; the slot will deliver p:2 again, and the broker would take it.
    await skipMessage(d.db, { messageId: held!, ...operator });
    await skipMessage(d.db, { messageId: poison, ...operator });
    expect(await tableRows(d.db)).toBe(0);
    await rewind();
    await d.db
      .transaction()
      .execute((t) => walOutbox.enqueue(t, [{ topic, key: 'p', payload: Buffer.from('p:3') }]));
    const got = await readTopic(kafka, topic, (xs) => xs.some((x) => x.value === 'p:3'), 30_000);
    expect(await d.db.selectFrom('outbox_parked_key').selectAll().execute()).toEqual([]);
    // Neither skipped message comes back (p:2 would: the broker takes it).
    expect(got.map((x) => x.value)).toEqual(['p:3']);
  }, 120_000);

  it('a skipped moved message stays skipped when the slot delivers it again behind a later message of an overlapping writer (transactions come in commit order, messages carry where they were written)', async () => {
    const d = await wal.database('overlap');
    const topic = await createTestTopic('walrev-overlap', 1, { 'max.message.bytes': '1024' });
    const { poison, rewind } = await parkedThenSaved(d, topic, 'k1');
    // T1 writes k1:1 first and commits last; T2's k2:1 is written after it and commits before.
    const t1 = new pg.Client({
      connectionString: d.url,
      options: `-c search_path=${await wal.outboxSchema(d.db)}`,
    });
    await t1.connect();
    const k11 = randomUUID();
    try {
      await t1.query('BEGIN');
      await t1.query(`INSERT INTO outbox_wal (message_id, topic, key, payload) VALUES ($1, $2, 'k1', $3)`, [
        k11,
        topic,
        Buffer.from('k1:1'),
      ]);
      await d.db
        .transaction()
        .execute((t) => walOutbox.enqueue(t, [{ topic, key: 'k2', payload: Buffer.from('k2:1') }]));
      await t1.query('COMMIT');
    } finally {
      await t1.end();
    }
    await waitFor('k1:1 moved behind the parked key', async () => (await tableRows(d.db)) === 2, 20_000);
    await skipMessage(d.db, { messageId: k11, ...operator });
    await skipMessage(d.db, { messageId: poison, ...operator });
    await rewind();
    await d.db
      .transaction()
      .execute((t) => walOutbox.enqueue(t, [{ topic, key: 'k1', payload: Buffer.from('k1:2') }]));
    const got = await readTopic(kafka, topic, (xs) => xs.some((x) => x.value === 'k1:2'), 30_000);
    expect(got.map((x) => x.value).filter((v) => v.startsWith('k1'))).toEqual(['k1:2']);
  }, 120_000);

  it('the secret is made once and kept: an update, a delete or a truncate is refused', async () => {
    const d = await wal.database('secret');
    for (const statement of [
      sql`UPDATE outbox_wal_secret SET secret = repeat('0', 64)`,
      sql`DELETE FROM outbox_wal_secret`,
      sql`TRUNCATE outbox_wal_secret`,
    ]) {
      await expect(statement.execute(d.db)).rejects.toThrow(/never changed/);
    }
  }, 60_000);

  it("cairn outbox skip drops a message that has two rows (a tenant's own and the one the relay moved)", async () => {
    const d = await wal.database('skip2');
    const id = randomUUID();
    for (const fromWal of [false, true])
      await sql`INSERT INTO outbox (lane, message_id, topic, key, payload, from_wal)
                VALUES (0, ${id}::uuid, 't', 'k', '\\x00'::bytea, ${fromWal})`.execute(d.db);
    await skipMessage(d.db, { messageId: id, actor: 'spiffe://cairn.test/operator', reason: 'x' });
    expect(await tableRows(d.db)).toBe(0);
  }, 60_000);
});
