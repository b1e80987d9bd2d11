import { sql } from 'kysely';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { relayMetrics } from '../../relay/metrics.js';
import { createRelay, createRelayWithTestHooks, type Relay } from '../../relay/relay.js';
import { slotLag } from '../../relay/wal/walSetup.js';
import { allVisible } from '../../relay/wal/walVisibility.js';
import type { Db } from '../../src/db/database.js';
import { ConfigurationError } from '../../src/errors.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { skipMessage } from '../../src/outbox/operator.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { createTestDatabase, createTestTopic, kafkaBrokers } from '../support/testDatabase.js';
import { type ReadMessage, readTopic, waitFor } from '../support/topicReader.js';
import { useLogicalServer, type WalDatabase } from '../support/walServer.js';

// Issue 16 item 3: the relay's WAL mode, against a throw-away server with wal_level = logical.
// The table stays the authority (a row leaves it only after the broker's ack); what these
// tests hold the stream to: every row published, in order per key, whichever path it took
// (stream or sweep); nothing the table no longer has; the slot confirmed only past what was
// acknowledged or left in the table; several relays sharing the lanes while one streams.

const kafka = kafkaClient(kafkaBrokers(), 'wal-relay-test');
const outbox = createOutbox();
const wal = useLogicalServer('wal');
const walDatabase = (label: string) => wal.database(label);
const start = (relay: Relay) => wal.start(relay);
const walRelay = (d: WalDatabase, extra: { instanceId?: string } = {}) => wal.walRelay(d, extra);

/** Messages of `keys` keys, `n` in all, numbered per key in the payload ("key:seq"). */
async function enqueue(db: Db, topic: string, keys: string[], n: number, from = 0): Promise<void> {
  const seq = new Map<string, number>();
  const batches: Array<Array<{ topic: string; key: string; payload: Buffer }>> = [];
  for (let i = 0; i < n; i++) {
    const key = keys[i % keys.length]!;
    const s = (seq.get(key) ?? from) + 1;
    seq.set(key, s);
    if (i % 10 === 0) batches.push([]);
    batches.at(-1)!.push({ topic, key, payload: Buffer.from(`${key}:${s}`) });
  }
  // Transactions in order: a key's later message commits after its earlier one.
  for (const b of batches) await db.transaction().execute((t) => outbox.enqueue(t, b));
}

/** Each key's sequence numbers in first-delivery order; throws unless they only go up. */
function firstDeliveries(messages: readonly ReadMessage[]): Map<string, number[]> {
  const seen = new Set<string>();
  const perKey = new Map<string, number[]>();
  for (const m of messages) {
    if (seen.has(m.value)) continue; // a duplicate (same message id): the inbox drops it
    seen.add(m.value);
    const [key, s] = m.value.split(':');
    const list = perKey.get(key!) ?? [];
    list.push(Number(s));
    perKey.set(key!, list);
  }
  for (const [key, list] of perKey) {
    for (let i = 1; i < list.length; i++) {
      if (list[i]! <= list[i - 1]!) throw new Error(`key ${key} out of order: ${list.join(',')}`);
    }
  }
  return perKey;
}

const distinct = (ms: readonly ReadMessage[]) => new Set(ms.map((m) => m.value)).size;
const backlog = async (db: Db) =>
  (await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox`.execute(db)).rows[0]!.n;

describe('issue 16: the relay in WAL mode', () => {
  it('publishes rows from before its start (through the table) and after (from the stream) in order per key, empties the table and confirms the slot', async () => {
    const d = await walDatabase('order');
    const topic = await createTestTopic('wal-order', 4);
    const keys = Array.from({ length: 20 }, (_, i) => `k${i}`);
    await enqueue(d.db, topic, keys, 200);
    const relay = start(walRelay(d));
    await waitFor('the stream to start', async () => relay.stats().wal?.streaming === true, 30_000);
    await enqueue(d.db, topic, keys, 1000, 10);
    const got = await readTopic(kafka, topic, (ms) => distinct(ms) >= 1200, 60_000);
    const perKey = firstDeliveries(got);
    expect(distinct(got)).toBe(1200);
    // Each sent once: a row the walsender handed over a moment before it was visible is deleted
    // on a later try, not swept and sent again.
    expect(got).toHaveLength(1200);
    for (const k of keys) expect(perKey.get(k)).toHaveLength(60);
    await waitFor('the table to be empty', async () => (await backlog(d.db)) === 0, 30_000);
    const stats = relay.stats();
    expect(stats.lostLaneDeletes).toBe(0);
    expect(stats.wal?.streamed).toBeGreaterThanOrEqual(1000);
    expect(stats.wal?.heldLanes).toBe(0);
    expect(stats.wal?.confirmedLsn).not.toBeNull();
    const metrics = await relayMetrics(relay, d.db).metrics();
    expect(metrics).toMatch(/^cairn_relay_wal_streaming 1$/m);
    expect(metrics).toMatch(/^cairn_relay_wal_slot_lag_bytes \d+$/m);
    // Idle, the slot is confirmed up to what the server sent: it holds next to no WAL.
    await waitFor(
      'the slot to be confirmed to the end of the WAL',
      async () => ((await slotLag(d.db, d.slot))?.lagBytes ?? Number.POSITIVE_INFINITY) < 64 * 1024,
      30_000,
    );
  }, 180_000);

  it('a row deleted from the table after its commit (an operator skip) is not published when the stream delivers it after a restart; its key keeps its order', async () => {
    const d = await walDatabase('skip');
    const topic = await createTestTopic('wal-skip', 1);
    // Create the slot, then stop: what follows is in the WAL past the slot's position.
    const first = start(walRelay(d));
    await waitFor('the stream to start', async () => first.stats().wal?.streaming === true, 30_000);
    await first.stop(); // (stopping it again after the test does nothing)
    const ids = await d.db.transaction().execute((t) =>
      outbox.enqueue(t, [
        { topic, key: 'a', payload: Buffer.from('a:1') },
        { topic, key: 'a', payload: Buffer.from('a:2') },
        { topic, key: 'b', payload: Buffer.from('b:1') },
      ]),
    );
    await d.db
      .transaction()
      .execute((t) => outbox.enqueue(t, [{ topic, key: 'a', payload: Buffer.from('a:3') }]));
    await skipMessage(d.db, {
      messageId: ids[1]!,
      actor: 'spiffe://cairn.test/operator',
      reason: 'dropped before the relay ran',
    });
    const relay = start(walRelay(d));
    await waitFor('the stream to start', async () => relay.stats().wal?.streaming === true, 30_000);
    await waitFor('the table to be empty', async () => (await backlog(d.db)) === 0, 30_000);
    await d.db
      .transaction()
      .execute((t) => outbox.enqueue(t, [{ topic, key: 'a', payload: Buffer.from('a:4') }]));
    const got = await readTopic(kafka, topic, (ms) => ms.some((m) => m.value === 'a:4'), 30_000);
    expect(relay.stats().wal?.streamed).toBeGreaterThanOrEqual(4); // a:1..a:3 and b:1 came by the stream too
    expect(got.map((m) => m.value)).not.toContain('a:2');
    expect(firstDeliveries(got).get('a')).toEqual([1, 3, 4]);
  }, 120_000);

  it.each([
    ['while the relay streams', true],
    ['before the stream started (rows read from the table first)', false],
  ])(
    'a key the broker refuses is parked (rows written %s); the stream holds its later rows; after the skip they follow in order, other keys never wait',
    async (_when, streamFirst) => {
      const d = await walDatabase('poison');
      const topic = await createTestTopic('wal-poison', 1, { 'max.message.bytes': '1024' });
      const relay = walRelay(d);
      const streaming = () => relay.stats().wal?.streaming === true && relay.stats().wal?.heldLanes === 0;
      if (streamFirst) {
        start(relay);
        await waitFor('the stream to start and drain', async () => streaming(), 30_000);
      }
      const m = (key: string, s: number, bytes = 0) => ({
        topic,
        key,
        payload: Buffer.from(`${key}:${s}`.padEnd(bytes, ' ')),
      });
      const [, poison] = await d.db
        .transaction()
        .execute((t) => outbox.enqueue(t, [m('p', 1), m('p', 2, 4000), m('p', 3), m('h', 1)]));
      await d.db.transaction().execute((t) => outbox.enqueue(t, [m('p', 4), m('h', 2)]));
      if (!streamFirst) start(relay);
      await waitFor(
        'the key to be parked and the healthy key through',
        async () => (await d.db.selectFrom('outbox_parked_key').selectAll().execute()).length === 1,
        30_000,
      );
      const before = await readTopic(
        kafka,
        topic,
        (ms) => ms.some((x) => x.value === 'h:2') && ms.some((x) => x.value === 'p:1'),
        15_000,
      );
      // The healthy key is not held behind the parked one (it came before the skip below).
      expect(before.map((x) => x.value.trim())).toContain('h:2');
      expect(before.map((x) => x.value.trim()).filter((v) => v.startsWith('p'))).toEqual(['p:1']);
      await waitFor('the stream to start', async () => relay.stats().wal?.streaming === true, 30_000);
      await skipMessage(d.db, {
        messageId: poison!,
        actor: 'spiffe://cairn.test/operator',
        reason: 'too large for the topic',
      });
      await d.db.transaction().execute((t) => outbox.enqueue(t, [m('p', 5)]));
      const after = await readTopic(kafka, topic, (ms) => ms.some((x) => x.value === 'p:5'), 30_000);
      expect(firstDeliveries(after.map((x) => ({ ...x, value: x.value.trim() }))).get('p')).toEqual([
        1, 3, 4, 5,
      ]);
    },
    120_000,
  );

  it('two relays share the lanes: one streams the slot, the other reads its lanes from the table; stopping the first hands the slot over, nothing is lost or reordered', async () => {
    const d = await walDatabase('two');
    const topic = await createTestTopic('wal-two', 4);
    const keys = Array.from({ length: 16 }, (_, i) => `k${i}`);
    const a = start(walRelay(d, { instanceId: 'relay-a' }));
    await waitFor('relay a to stream', async () => a.stats().wal?.streaming === true, 30_000);
    const b = start(walRelay(d, { instanceId: 'relay-b' }));
    await waitFor(
      'both to own lanes',
      async () => b.stats().lanesOwned > 0 && a.stats().lanesOwned < 32,
      30_000,
    );
    expect(b.stats().wal?.streaming).toBe(false);
    await enqueue(d.db, topic, keys, 480);
    await readTopic(kafka, topic, (ms) => distinct(ms) >= 480, 60_000);
    await a.stop();
    await waitFor('relay b to take the slot', async () => b.stats().wal?.streaming === true, 30_000);
    await enqueue(d.db, topic, keys, 160, 30);
    const got = await readTopic(kafka, topic, (ms) => distinct(ms) >= 640, 60_000);
    expect(distinct(got)).toBe(640);
    for (const k of keys) expect(firstDeliveries(got).get(k)).toHaveLength(40);
    await waitFor('the table to be empty', async () => (await backlog(d.db)) === 0, 30_000);
  }, 180_000);

  it('a publish that fails after the stream handed rows over leaves them to the table: republished (same ids), none lost, order kept', async () => {
    const d = await walDatabase('fail');
    const topic = await createTestTopic('wal-fail', 2);
    let failures = 0;
    const relay = createRelayWithTestHooks(
      {
        db: d.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        maxIdleMs: 50,
        wal: { connectionString: d.url, slot: d.slot, sweepEveryMs: 300 },
      },
      {
        afterPublish() {
          // The broker acked, then the relay fails before its delete (twice).
          if (relay.stats().wal?.streaming && failures < 2) {
            failures++;
            throw new Error('injected: failed after the ack');
          }
        },
      },
    );
    start(relay);
    await waitFor(
      'the stream to start and drain',
      async () => relay.stats().wal?.streaming === true && relay.stats().wal?.heldLanes === 0,
      30_000,
    );
    const keys = ['x', 'y', 'z'];
    await enqueue(d.db, topic, keys, 300);
    const got = await readTopic(kafka, topic, (ms) => distinct(ms) >= 300, 60_000);
    expect(failures).toBe(2);
    for (const k of keys) expect(firstDeliveries(got).get(k)).toHaveLength(100);
    await waitFor('the table to be empty', async () => (await backlog(d.db)) === 0, 30_000);
  }, 120_000);

  it('the replication connection killed, then the slot dropped under the relay: it reads the table meanwhile, makes a new slot, streams again; nothing lost, order kept', async () => {
    const d = await walDatabase('dropped');
    const topic = await createTestTopic('wal-dropped', 3);
    const keys = ['a', 'b', 'c', 'd'];
    const relay = start(walRelay(d));
    const streaming = () => relay.stats().wal?.streaming === true && relay.stats().wal?.heldLanes === 0;
    await waitFor('the stream to start', async () => streaming(), 30_000);
    await enqueue(d.db, topic, keys, 40);
    // Kill its walsender and drop the slot (again if the relay took it back in between).
    await waitFor(
      'the slot to be dropped',
      async () => {
        await sql`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
                   WHERE slot_name = ${d.slot} AND active_pid IS NOT NULL`.execute(d.db);
        return sql`SELECT pg_drop_replication_slot(${d.slot})`
          .execute(d.db)
          .then(() => true)
          .catch(() => false);
      },
      30_000,
    );
    await enqueue(d.db, topic, keys, 40, 10);
    await waitFor(
      'a new slot, streamed',
      async () => streaming() && (await slotLag(d.db, d.slot)) !== undefined,
      30_000,
    );
    await enqueue(d.db, topic, keys, 40, 20);
    const got = await readTopic(kafka, topic, (ms) => distinct(ms) >= 120, 60_000);
    for (const k of keys) expect(firstDeliveries(got).get(k)).toHaveLength(30);
    await waitFor('the table to be empty', async () => (await backlog(d.db)) === 0, 30_000);
  }, 120_000);

  it('allVisible: a transaction still running is not visible, the same once committed (the sweep waits for it)', async () => {
    const d = await walDatabase('visible');
    const client = new pg.Client({ connectionString: d.url });
    await client.connect();
    try {
      await client.query('BEGIN');
      const { rows } = await client.query<{ xid: string }>(
        'SELECT (pg_current_xact_id()::text::bigint & 4294967295)::text AS xid',
      );
      const xid = Number(rows[0]!.xid);
      expect(await allVisible(d.db, [xid])).toBe(false);
      await client.query('COMMIT');
      expect(await allVisible(d.db, [xid])).toBe(true);
      expect(await allVisible(d.db, [])).toBe(true);
    } finally {
      await client.end();
    }
  });

  it('refuses to start on a server without wal_level = logical, naming the setting', async () => {
    const tdb = await createTestDatabase('wal_replica');
    try {
      const relay = createRelay({
        db: tdb.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        wal: { connectionString: tdb.url, slot: 'never_created' },
      });
      const err = await relay.run().catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ConfigurationError);
      expect((err as Error).message).toMatch(/wal_level is replica.*wal_level = logical/);
    } finally {
      await tdb.drop();
    }
  });

  it('refuses a slot name that is not an identifier, and a slot of another database', async () => {
    const d = await walDatabase('names');
    expect(() =>
      createRelay({
        db: d.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        wal: { connectionString: d.url, slot: 'Bad-Name"; DROP' },
      }),
    ).toThrow(/wal\.slot.*lower-case/);
    const other = await walDatabase('names_other');
    await wal.server.query(
      `SELECT pg_create_logical_replication_slot('${other.slot}', 'pgoutput')`,
      other.url.split('/').pop(),
    );
    const relay = createRelay({
      db: d.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      wal: { connectionString: d.url, slot: other.slot },
    });
    const err = await relay.run().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConfigurationError);
    expect((err as Error).message).toMatch(/exists for plugin pgoutput on database wal_names_other/);
  });
});
