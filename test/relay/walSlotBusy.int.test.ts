import { type AddressInfo, connect, createServer, type Socket } from 'node:net';
import { sql } from 'kysely';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { createRelay, type Relay } from '../../relay/relay.js';
import { prepareWal } from '../../relay/wal/walSetup.js';
import { startWalStream } from '../../relay/wal/walStream.js';
import type { Db } from '../../src/db/database.js';
import { UnavailableError } from '../../src/errors.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { silentLogger } from '../../src/logger.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { type Child, sigkill, sigterm, spawnTs } from '../support/processes.js';
import { createTestTopic, kafkaBrokers } from '../support/testDatabase.js';
import { type ReadMessage, readTopic, waitFor } from '../support/topicReader.js';
import { useLogicalServer, type WalDatabase } from '../support/walServer.js';

// A WAL relay started while the replication slot is held by another connection (a relay that is
// paused, SIGSTOP or a long GC, its walsender still connected): Postgres refuses its
// START_REPLICATION with 55006 ("replication slot ... is active for PID ..."). That is no reason
// to end, and no reason to drop the slot (walMode.ts remakeSlot is for slots that can never be
// streamed): the relay sweeps the table until it can stream, then streams. The paused relay,
// woken after its walsender was ended and the slot taken over, cannot take the slot back nor
// move its position.

const kafka = kafkaClient(kafkaBrokers(), 'wal-slot-busy-test');
const outbox = createOutbox();
const wal = useLogicalServer('walbusy');

/** `n` messages over `keys`, numbered per key from `from + 1` ("key:seq"), ten per transaction. */
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
  for (const b of batches) await db.transaction().execute((t) => outbox.enqueue(t, b));
}

/** Each key's sequence numbers in delivery order (duplicates included: the test wants none). */
function perKey(messages: readonly ReadMessage[]): Map<string, number[]> {
  const out = new Map<string, number[]>();
  for (const m of messages) {
    const [key, s] = m.value.split(':');
    out.set(key!, [...(out.get(key!) ?? []), Number(s)]);
  }
  return out;
}

const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);
const distinct = (ms: readonly ReadMessage[]) => new Set(ms.map((m) => m.value)).size;
const backlog = async (db: Db) =>
  (await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox`.execute(db)).rows[0]!.n;

/**
 * The slot: the walsender streaming it (null when none: the backend creating a slot holds it
 * active for a moment too, and is no stream), and how far it is confirmed.
 */
async function slotState(d: WalDatabase) {
  const { rows } = await sql<{ pid: number | null; confirmed: string; behind_wal_end: boolean }>`
    SELECT a.pid, s.confirmed_flush_lsn::text AS confirmed,
           s.confirmed_flush_lsn <= pg_current_wal_lsn() AS behind_wal_end
      FROM pg_replication_slots s
      LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid AND a.backend_type = 'walsender'
     WHERE s.slot_name = ${d.slot}`.execute(d.db);
  return rows[0];
}

const lsnAtLeast = async (db: Db, a: string, b: string) =>
  (await sql<{ ok: boolean }>`SELECT ${a}::pg_lsn >= ${b}::pg_lsn AS ok`.execute(db)).rows[0]!.ok;

/** A WAL relay in this process whose log lines (warn and above) the test reads. */
function capturedRelay(d: WalDatabase): { relay: Relay; lines: string[] } {
  const lines: string[] = [];
  const logger = pino({ level: 'warn' }, { write: (s: string) => void lines.push(s) });
  const relay = createRelay({
    db: d.db,
    publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
    logger,
    instanceId: 'relay-new',
    maxIdleMs: 50,
    leaseTtlMs: 3000,
    wal: { connectionString: d.url, slot: d.slot, sweepEveryMs: 300 },
  });
  return { relay, lines };
}

/** Runs the relay until the test ends; `ended()` says whether run() settled (it must not). */
function startWatched(relay: Relay): { ended(): unknown } {
  let ended: unknown;
  wal.start(relay);
  relay.run().then(
    () => {
      ended = 'resolved';
    },
    (err: Error) => {
      ended = err;
    },
  );
  return { ended: () => ended };
}

const REMADE = /making it again/;

describe('a WAL relay started while the slot is held by a paused relay (55006)', () => {
  it('does not end: it sweeps the table meanwhile (every row once, in order per key), streams once the slot is free, drops no slot; the paused relay, woken, cannot take the slot back or move it', async () => {
    const d = await wal.database('paused');
    const topic = await createTestTopic('wal-busy', 3);
    const keys = ['a', 'b', 'c', 'd', 'e', 'f'];
    // The relay that will be paused: a real `cairn relay` process streaming the slot.
    const old: Child = spawnTs('relay-paused', 'relay/main.ts', {
      DATABASE_URL: d.url,
      KAFKA_BROKERS: kafkaBrokers().join(','),
      CAIRN_RELAY_MODE: 'wal',
      CAIRN_RELAY_WAL_SLOT: d.slot,
      CAIRN_RELAY_INSTANCE: 'relay-paused',
      CAIRN_RELAY_LEASE_TTL_MS: '1500',
      CAIRN_RELAY_MAX_IDLE_MS: '50',
      CAIRN_LOG_LEVEL: 'warn',
    });
    try {
      await waitFor(
        'the first relay to stream the slot',
        async () => (await slotState(d))?.pid != null,
        60_000,
      );
      const oldPid = (await slotState(d))!.pid!;
      old.proc.kill('SIGSTOP'); // its walsender stays connected: the slot stays active for it

      await enqueue(d.db, topic, keys, 120); // a:1..a:20 and so on
      const { relay, lines } = capturedRelay(d);
      const run = startWatched(relay);

      // Refused with 55006 for the paused relay's walsender: it reads the table meanwhile.
      await waitFor(
        'the new relay to be refused the slot',
        () => lines.some((l) => l.includes(`is active for PID ${oldPid}`)),
        30_000,
      );
      await waitFor('the rows to be swept and deleted', async () => (await backlog(d.db)) === 0, 60_000);
      let got = await readTopic(kafka, topic, (ms) => distinct(ms) >= 120, 30_000);
      expect(run.ended()).toBeUndefined();
      expect(relay.stats().wal).toMatchObject({ streaming: false, streamed: 0 });
      expect(relay.stats().lanesOwned).toBe(32);
      // The slot is still the paused relay's: neither dropped nor made again.
      expect((await slotState(d))?.pid).toBe(oldPid);
      expect(lines.filter((l) => REMADE.test(l))).toEqual([]);
      expect(got).toHaveLength(120);
      for (const k of keys) expect(perKey(got).get(k)).toEqual(range(1, 20));

      // wal_sender_timeout ends a paused client's walsender; here at once, not after 60 s.
      await sql`SELECT pg_terminate_backend(${oldPid}::int)`.execute(d.db);
      await waitFor('the new relay to stream the slot', async () => wal.streaming(relay), 30_000);
      const newPid = (await slotState(d))!.pid;
      expect(newPid).not.toBeNull();
      expect(newPid).not.toBe(oldPid);
      await enqueue(d.db, topic, keys, 120, 20); // a:21..a:40
      got = await readTopic(kafka, topic, (ms) => distinct(ms) >= 240, 60_000);
      expect(relay.stats().wal!.streamed).toBeGreaterThanOrEqual(120);
      await waitFor(
        'the streamed rows to be deleted and the slot confirmed',
        async () => (await backlog(d.db)) === 0 && relay.stats().wal?.confirmedLsn != null,
        30_000,
      );
      const confirmedBefore = (await slotState(d))!.confirmed;

      // The paused relay wakes: its stream is gone; the slot is streamed by another walsender,
      // so it is refused (55006) and neither takes the slot back nor drops it.
      old.proc.kill('SIGCONT');
      await waitFor(
        'the woken relay to be refused the slot',
        () => old.output().includes(`is active for PID ${newPid}`),
        30_000,
      );
      const after = (await slotState(d))!;
      expect(after.pid).toBe(newPid);
      // Its stale status updates went nowhere: the position only moved forward, never past the WAL.
      expect(after.behind_wal_end).toBe(true);
      expect(await lsnAtLeast(d.db, after.confirmed, confirmedBefore)).toBe(true);
      expect(relay.stats().wal?.streaming).toBe(true);
      expect(old.output()).not.toMatch(REMADE);
      expect(await sigterm(old)).toBe(0); // it was running, not dead

      await enqueue(d.db, topic, keys, 120, 40); // a:41..a:60
      got = await readTopic(kafka, topic, (ms) => distinct(ms) >= 360, 60_000);
      await waitFor('the table to be empty', async () => (await backlog(d.db)) === 0, 30_000);
      expect(run.ended()).toBeUndefined();
      expect(relay.stats().wal?.streaming).toBe(true);
      expect((await slotState(d))?.pid).toBe(newPid);
      expect(lines.filter((l) => REMADE.test(l))).toEqual([]);
      expect(got).toHaveLength(360);
      for (const k of keys) expect(perKey(got).get(k)).toEqual(range(1, 60));
    } finally {
      if (old.proc.signalCode === null && old.proc.exitCode === null) old.proc.kill('SIGCONT');
      await sigkill(old);
    }
  }, 240_000);

  it('held by a plain replication connection (not a relay): the new relay publishes every row once in order through the table, then streams once the connection ends; the slot is never dropped', async () => {
    const d = await wal.database('held');
    const topic = await createTestTopic('wal-held', 2);
    const keys = ['x', 'y', 'z'];
    await prepareWal(d.db, { slot: d.slot, publication: 'cairn_outbox' });
    const holder = await startWalStream({
      connectionString: d.url,
      slot: d.slot,
      publication: 'cairn_outbox',
      schema: await wal.outboxSchema(d.db),
      log: silentLogger,
    });
    try {
      const holderPid = (await slotState(d))!.pid;
      expect(holderPid).not.toBeNull();
      await enqueue(d.db, topic, keys, 60);
      const { relay, lines } = capturedRelay(d);
      const run = startWatched(relay);
      await waitFor(
        'the new relay to be refused the slot',
        () => lines.some((l) => l.includes(`is active for PID ${holderPid}`)),
        30_000,
      );
      await enqueue(d.db, topic, keys, 60, 20); // written while it cannot stream
      let got = await readTopic(kafka, topic, (ms) => distinct(ms) >= 120, 60_000);
      await waitFor('the table to be empty', async () => (await backlog(d.db)) === 0, 30_000);
      expect(run.ended()).toBeUndefined();
      expect(relay.stats().wal).toMatchObject({ streaming: false, streamed: 0 });
      expect((await slotState(d))?.pid).toBe(holderPid);

      await holder.stop();
      await waitFor('the new relay to stream the slot', async () => wal.streaming(relay), 30_000);
      await enqueue(d.db, topic, keys, 60, 40);
      got = await readTopic(kafka, topic, (ms) => distinct(ms) >= 180, 60_000);
      await waitFor('the table to be empty', async () => (await backlog(d.db)) === 0, 30_000);
      expect(relay.stats().wal!.streamed).toBeGreaterThanOrEqual(60);
      expect(got).toHaveLength(180);
      for (const k of keys) expect(perKey(got).get(k)).toEqual(range(1, 60));
      expect(lines.filter((l) => REMADE.test(l))).toEqual([]);
      expect(run.ended()).toBeUndefined();
    } finally {
      await holder.stop();
    }
  }, 180_000);
});

describe('a replication connection that closes before the server answers START_REPLICATION', () => {
  it('fails the stream’s start (UnavailableError) instead of leaving it, and the relay that awaits it, waiting for good', async () => {
    const d = await wal.database('cut');
    await prepareWal(d.db, { slot: d.slot, publication: 'cairn_outbox' });
    const target = new URL(d.url);
    // A proxy that forwards the connection until the client asks for the stream, then cuts it.
    const sockets = new Set<Socket>();
    const proxy = createServer((client) => {
      const upstream = connect(Number(target.port), target.hostname);
      sockets.add(client).add(upstream);
      upstream.on('data', (b) => client.write(b));
      client.on('data', (b) => {
        if (b.includes('START_REPLICATION')) {
          client.destroy();
          upstream.destroy();
        } else upstream.write(b);
      });
      for (const s of [client, upstream]) s.on('error', () => {}).on('close', () => sockets.delete(s));
    });
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    const via = new URL(d.url);
    via.port = String((proxy.address() as AddressInfo).port);
    try {
      const start = startWalStream({
        connectionString: via.toString(),
        slot: d.slot,
        publication: 'cairn_outbox',
        schema: await wal.outboxSchema(d.db),
        log: silentLogger,
      });
      const outcome = await Promise.race([
        start.then(
          async (s) => {
            await s.stop();
            return 'started';
          },
          (err: Error) => err,
        ),
        new Promise((r) => setTimeout(() => r('still waiting after 10 s'), 10_000)),
      ]);
      expect(outcome).toBeInstanceOf(UnavailableError);
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise((r) => proxy.close(r));
    }
  });
});
