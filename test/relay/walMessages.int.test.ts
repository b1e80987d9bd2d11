import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import pg from 'pg';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { createRelayWithTestHooks } from '../../relay/relay.js';
import { slotLag } from '../../relay/wal/walSetup.js';
import { createDb, type Db } from '../../src/db/database.js';
import { forTenant, registerTenant } from '../../src/db/tenant.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { skipMessage } from '../../src/outbox/operator.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { createTestTopic, kafkaBrokers } from '../support/testDatabase.js';
import { type ReadMessage, readTopic, waitFor } from '../support/topicReader.js';
import { useLogicalServer } from '../support/walServer.js';

// Issue 16 item 3: outbox messages written to the WAL only (migration 0019). No table row: the
// slot is the message's only copy until the broker acked it. What these tests hold it to:
// every message published, in order per key, with the headers a row would have; the slot
// confirmed only past what was acknowledged or moved into the table (a parked key, a failed
// step: read again from the slot); no role but the outbox's owner can write one as another
// tenant, and none is written while no relay can read it.

const kafka = kafkaClient(kafkaBrokers(), 'wal-messages-test');
const rowsOutbox = createOutbox();
const walOutbox = createOutbox({ walMessages: true });
const wal = useLogicalServer('walmsg');

async function enqueue(db: Db, topic: string, keys: string[], n: number): Promise<void> {
  const seq = new Map<string, number>();
  for (let i = 0; i < n; i += 10) {
    const batch: Array<{ topic: string; key: string; payload: Buffer }> = [];
    for (let j = i; j < Math.min(n, i + 10); j++) {
      const key = keys[j % keys.length]!;
      const s = (seq.get(key) ?? 0) + 1;
      seq.set(key, s);
      batch.push({ topic, key, payload: Buffer.from(`${key}:${s}`) });
    }
    await db.transaction().execute((t) => walOutbox.enqueue(t, batch));
  }
}

function firstDeliveries(messages: readonly ReadMessage[]): Map<string, number[]> {
  const seen = new Set<string>();
  const perKey = new Map<string, number[]>();
  for (const m of messages) {
    const v = m.value.trim();
    if (seen.has(v)) continue;
    seen.add(v);
    const [key, s] = v.split(':');
    perKey.set(key!, [...(perKey.get(key!) ?? []), Number(s)]);
  }
  return perKey;
}
const inOrder = (perKey: Map<string, number[]>) =>
  [...perKey.values()].every((l) => l.every((x, i) => i === 0 || x > l[i - 1]!));
const distinct = (ms: readonly ReadMessage[]) => new Set(ms.map((m) => m.value)).size;
const tableRows = async (db: Db) =>
  (await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox`.execute(db)).rows[0]!.n;
const streamingDrained = (d: { stats(): { wal?: { streaming: boolean; heldLanes: number } } }) =>
  d.stats().wal?.streaming === true && d.stats().wal?.heldLanes === 0;

describe('issue 16: outbox messages written to the WAL only', () => {
  it('are published in order per key with the headers a row gets, leave no row, and the slot is confirmed past them', async () => {
    const d = await wal.database('order');
    const topic = await createTestTopic('walmsg-order', 4);
    const relay = wal.start(wal.walRelay(d));
    await waitFor('the stream to start', async () => streamingDrained(relay), 30_000);
    expect(relay.stats().wal?.readsMessages).toBe(true);
    const keys = Array.from({ length: 12 }, (_, i) => `k${i}`);
    await enqueue(d.db, topic, keys, 600);
    // One message each way, to compare what the consumer sees.
    await d.db.transaction().execute(async (t) => {
      await rowsOutbox.enqueue(t, [
        { topic, key: 'row', payload: Buffer.from('x-row'), headers: { h: '1' } },
      ]);
      await walOutbox.enqueue(t, [{ topic, key: 'wal', payload: Buffer.from('x-wal'), headers: { h: '1' } }]);
    });
    const got = await readTopic(kafka, topic, (ms) => distinct(ms) >= 602, 60_000);
    const perKey = firstDeliveries(got.filter((m) => m.key !== 'row' && m.key !== 'wal'));
    expect(inOrder(perKey)).toBe(true);
    expect([...perKey.values()].reduce((n, l) => n + l.length, 0)).toBe(600);
    const headerNames = (key: string) =>
      Object.keys(got.find((m) => m.key === key)!.headers)
        .filter((h) => h !== 'cairn-message-id')
        .sort();
    expect(headerNames('wal')).toEqual(headerNames('row'));
    expect(await tableRows(d.db)).toBe(0);
    expect(relay.stats().wal?.movedToTable).toBe(0);
    await waitFor(
      'the slot confirmed',
      async () => ((await slotLag(d.db, d.slot))?.lagBytes ?? 1e9) < 65_536,
      20_000,
    );
  }, 120_000);

  it('are refused, not lost, while no relay reads them: before any relay registered its slot, and once the slot is gone (the relay says messages may be lost, and registers again)', async () => {
    const d = await wal.database('noreader');
    const topic = await createTestTopic('walmsg-noreader', 1);
    const m = (v: string) => [{ topic, key: 'a', payload: Buffer.from(v) }];
    await expect(d.db.transaction().execute((t) => walOutbox.enqueue(t, m('a:0')))).rejects.toThrow(
      /no registered replication slot/,
    );
    const first = wal.start(wal.walRelay(d));
    await waitFor('the stream to start', async () => streamingDrained(first), 30_000);
    await d.db.transaction().execute((t) => walOutbox.enqueue(t, m('a:1')));
    await readTopic(kafka, topic, (ms) => ms.length >= 1, 30_000);
    await first.stop();
    // The slot is gone (dropped by hand, invalidated, or a promoted standby never had it).
    await sql`SELECT pg_drop_replication_slot(${d.slot})`.execute(d.db);
    await expect(d.db.transaction().execute((t) => walOutbox.enqueue(t, m('a:2')))).rejects.toThrow(
      /no registered replication slot/,
    );
    const again = wal.start(wal.walRelay(d));
    await waitFor('the stream to start', async () => streamingDrained(again), 30_000);
    expect(again.stats().wal?.messagesMaybeLost).toBe(1);
    await d.db.transaction().execute((t) => walOutbox.enqueue(t, m('a:3')));
    const got = await readTopic(kafka, topic, (ms) => ms.some((x) => x.value === 'a:3'), 30_000);
    expect(got.map((x) => x.value)).toEqual(['a:1', 'a:3']);
  }, 120_000);

  it('a message written while the slot is being made again (it waits for a running transaction) is refused, not lost', async () => {
    const d = await wal.database('remake');
    const topic = await createTestTopic('walmsg-remake', 1);
    const first = wal.start(wal.walRelay(d));
    await waitFor('the stream to start', async () => streamingDrained(first), 30_000);
    await first.stop();
    await sql`SELECT pg_drop_replication_slot(${d.slot})`.execute(d.db);
    // Any session with an xid open (a tenant's idle transaction, a long batch job) holds up the new slot.
    const long = new pg.Client({ connectionString: d.url });
    await long.connect();
    await long.query('BEGIN');
    await long.query('SELECT txid_current()');
    try {
      const again = wal.start(wal.walRelay(d));
      const listed = sql<{
        n: number;
      }>`SELECT count(*)::int AS n FROM pg_replication_slots WHERE slot_name = ${d.slot}`;
      await waitFor(
        'the slot listed while it is made',
        async () => (await listed.execute(d.db)).rows[0]!.n === 1,
        20_000,
      );
      const w = (v: string) => [{ topic, key: 'k', payload: Buffer.from(v) }];
      await expect(d.db.transaction().execute((t) => walOutbox.enqueue(t, w('w:1')))).rejects.toThrow(
        /no registered replication slot/,
      );
      await long.query('COMMIT');
      await waitFor('the stream to start', async () => streamingDrained(again), 30_000);
      await d.db.transaction().execute((t) => walOutbox.enqueue(t, w('w:2')));
      const got = await readTopic(kafka, topic, (xs) => xs.some((x) => x.value === 'w:2'), 30_000);
      expect(got.map((x) => x.value)).toEqual(['w:2']);
    } finally {
      await long.end().catch(() => {});
    }
  }, 90_000);

  it('a message the outbox table would refuse (a NULL key, NULL headers) is refused at write, not dropped by the relay', async () => {
    const d = await wal.database('nulls');
    const topic = await createTestTopic('walmsg-nulls', 1);
    const relay = wal.start(wal.walRelay(d));
    await waitFor('the stream to start', async () => streamingDrained(relay), 30_000);
    for (const [key, headers] of [
      [null, '{}'],
      ['k', null],
    ] as const) {
      await expect(
        sql`INSERT INTO outbox_wal (message_id, topic, key, headers, payload)
            VALUES (gen_random_uuid(), ${topic}, ${key}, ${headers}::jsonb, '\\x01'::bytea)`.execute(d.db),
      ).rejects.toThrow(/may not be null/);
    }
  }, 60_000);

  it("a tenant's role writes only as itself; a WAL message of its own making (pg_logical_emit_message) is not published", async () => {
    const d = await wal.database('tenant');
    const topic = await createTestTopic('walmsg-tenant', 1);
    for (const t of ['tenant-a', 'tenant-b']) await registerTenant(d.db, t);
    const u = new URL(d.url);
    u.username = 'cairn_app';
    const app = createDb({ connectionString: u.toString(), max: 2 });
    const asA = forTenant(app, 'tenant-a');
    const lines: string[] = [];
    try {
      const relay = wal.start(
        wal.walRelay(d, { logger: pino({ level: 'error' }, { write: (l: string) => void lines.push(l) }) }),
      );
      await waitFor('the stream to start', async () => streamingDrained(relay), 30_000);
      // Through its own SQL, claiming to be tenant-b.
      await sql`INSERT INTO outbox_wal (message_id, tenant_id, topic, key, payload)
                VALUES (gen_random_uuid(), 'tenant-b', ${topic}, 'k', '\\x6b3a31'::bytea)`.execute(asA);
      // Any role may call pg_logical_emit_message (PUBLIC may, by default): a message written
      // that way, as tenant-b, lacks the secret only the outbox's owner reads; it is not published.
      const header = Buffer.from(
        JSON.stringify({ a: 'a guess', m: randomUUID(), t: 'tenant-b', p: topic, k: 'k', h: {} }),
      );
      const forged = Buffer.concat([Buffer.alloc(4), header, Buffer.from('forged')]);
      forged.writeInt32BE(header.length, 0);
      const prefix = `cairn.outbox:${await wal.outboxSchema(d.db)}`;
      await sql`SELECT pg_logical_emit_message(true, ${prefix}, ${forged}::bytea)`.execute(asA);
      await expect(sql`SELECT secret FROM outbox_wal_secret`.execute(asA)).rejects.toThrow(
        /permission denied/,
      );
      await waitFor('the forgery seen', async () => relay.stats().wal?.forgedMessages === 1, 20_000);
      // 300 more at once: one log line said so, not one per message (a tenant's way to flood it).
      await sql`SELECT pg_logical_emit_message(true, ${prefix}, ${forged}::bytea) FROM generate_series(1, 300)`.execute(
        asA,
      );
      await waitFor('the forgeries seen', async () => relay.stats().wal?.forgedMessages === 301, 20_000);
      expect(lines.filter((l) => l.includes('its trigger did not write'))).toHaveLength(1);
      // The application role acting for no tenant is refused, as row-level security refuses its rows.
      await expect(
        sql`INSERT INTO outbox_wal (message_id, topic, key, payload) VALUES (gen_random_uuid(), ${topic}, 'k', '\\x00'::bytea)`.execute(
          app,
        ),
      ).rejects.toThrow(/only a tenant's role, or the outbox's owner/);
      const got = await readTopic(kafka, topic, (ms) => ms.length >= 1, 30_000);
      expect(got).toHaveLength(1);
      expect(got[0]!.headers['cairn-tenant']).toBe('tenant-a');
    } finally {
      await app.destroy();
    }
  }, 120_000);

  it("a tenant's open transaction holding a message id (an outbox row of its own) does not hold the relay when a WAL message with that id must wait in the table", async () => {
    const d = await wal.database('lock');
    const topic = await createTestTopic('walmsg-lock', 1, { 'max.message.bytes': '1024' });
    const roles: Record<string, string> = {};
    for (const t of ['tenant-a', 'tenant-b']) roles[t] = await registerTenant(d.db, t);
    const u = new URL(d.url);
    u.username = 'cairn_app';
    const app = createDb({ connectionString: u.toString(), max: 2 });
    const [asA, asB] = [forTenant(app, 'tenant-a'), forTenant(app, 'tenant-b')];
    u.username = roles['tenant-a']!;
    const holder = new pg.Client({
      connectionString: u.toString(),
      options: `-c search_path=${await wal.outboxSchema(d.db)}`,
    });
    await holder.connect();
    try {
      const relay = wal.start(wal.walRelay(d));
      await waitFor('the stream to start', async () => streamingDrained(relay), 30_000);
      const id = randomUUID();
      await holder.query('BEGIN');
      await holder.query(
        `INSERT INTO outbox (lane, message_id, topic, key, payload) VALUES (0, $1, $2, 'x', '\\x00'::bytea)`,
        [id, topic],
      );
      // The same id as a WAL message the broker refuses (too large for the topic): the relay
      // parks its key and moves it into the table.
      await sql`INSERT INTO outbox_wal (message_id, topic, key, payload)
                VALUES (${id}::uuid, ${topic}, 'a-key', ${Buffer.alloc(4000, 1)}::bytea)`.execute(asA);
      await waitFor('the key parked', async () => relay.stats().parked === 1, 20_000);
      await asB
        .transaction()
        .execute((t) => walOutbox.enqueue(t, [{ topic, key: 'b-key', payload: Buffer.from('b:1') }]));
      const got = await readTopic(kafka, topic, (xs) => xs.some((x) => x.value === 'b:1'), 30_000);
      expect(got.map((x) => x.value)).toContain('b:1');
    } finally {
      await holder.query('ROLLBACK').catch(() => {});
      await holder.end();
      await app.destroy();
    }
  }, 120_000);

  it("a key the broker refuses is parked: the message and its key's later ones wait in the table, other keys flow; after the skip they follow in order", async () => {
    const d = await wal.database('poison');
    const topic = await createTestTopic('walmsg-poison', 1, { 'max.message.bytes': '1024' });
    const relay = wal.start(wal.walRelay(d));
    await waitFor('the stream to start', async () => streamingDrained(relay), 30_000);
    const m = (key: string, s: number, bytes = 0) => ({
      topic,
      key,
      payload: Buffer.from(`${key}:${s}`.padEnd(bytes, ' ')),
    });
    const [, poison] = await d.db
      .transaction()
      .execute((t) => walOutbox.enqueue(t, [m('p', 1), m('p', 2, 4000), m('p', 3), m('h', 1)]));
    await d.db.transaction().execute((t) => walOutbox.enqueue(t, [m('p', 4), m('h', 2)]));
    await waitFor(
      'the key parked',
      async () => (await d.db.selectFrom('outbox_parked_key').selectAll().execute()).length === 1,
      30_000,
    );
    const before = await readTopic(kafka, topic, (ms) => ms.some((x) => x.value.trim() === 'h:2'), 15_000);
    expect(before.map((x) => x.value.trim()).filter((v) => v.startsWith('p'))).toEqual(['p:1']);
    expect(await tableRows(d.db)).toBe(3); // p:2 (parked at), p:3, p:4
    await skipMessage(d.db, {
      messageId: poison!,
      actor: 'spiffe://cairn.test/operator',
      reason: 'too large',
    });
    await d.db.transaction().execute((t) => walOutbox.enqueue(t, [m('p', 5)]));
    const after = await readTopic(kafka, topic, (ms) => ms.some((x) => x.value.trim() === 'p:5'), 30_000);
    expect(firstDeliveries(after).get('p')).toEqual([1, 3, 4, 5]);
    await waitFor('the table empty', async () => (await tableRows(d.db)) === 0, 20_000);
  }, 120_000);

  it('a step that fails after taking messages (the broker or Postgres gone mid-batch) reads them again from the slot: none is lost, order holds', async () => {
    const d = await wal.database('fail');
    const topic = await createTestTopic('walmsg-fail', 2);
    let failures = 0;
    const relay = wal.start(
      createRelayWithTestHooks(
        {
          db: d.db,
          publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
          maxIdleMs: 50,
          leaseTtlMs: 3000,
          batchSize: 50,
          wal: { connectionString: d.url, slot: d.slot, sweepEveryMs: 300 },
        },
        {
          async afterPublish() {
            // Twice, after the broker acked: the slot was not confirmed past them yet.
            if (failures < 2 && relay.stats().published > 100) {
              failures++;
              throw new Error('the relay lost its database mid-batch (test)');
            }
          },
        },
      ),
    );
    await waitFor('the stream to start', async () => streamingDrained(relay), 30_000);
    await enqueue(d.db, topic, ['a', 'b', 'c', 'd'], 400);
    const got = await readTopic(kafka, topic, (ms) => distinct(ms) >= 400, 60_000);
    expect(failures).toBe(2);
    const perKey = firstDeliveries(got);
    expect(inOrder(perKey)).toBe(true);
    expect([...perKey.values()].map((l) => l.length)).toEqual([100, 100, 100, 100]);
    expect(await tableRows(d.db)).toBe(0);
  }, 120_000);
});
