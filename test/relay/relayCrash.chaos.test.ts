import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { startLocalKafka, stopLocalKafka } from '../../cli/stack/kafka.js';
import { createRelay } from '../../relay/relay.js';
import { type PgServer, startPrimary } from '../../scripts/failover/pgCluster.js';
import { createDb, type Db } from '../../src/db/database.js';
import { migrateToLatest } from '../../src/db/migrate.js';
import { createKafkaPublisher, kafkaClient } from '../../src/kafka/publisher.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { type Child, sigkill, sigterm, spawnTs } from '../support/processes.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { type ReadMessage, readTopic, waitFor } from '../support/topicReader.js';

const kafka = kafkaClient(kafkaBrokers(), 'relay-chaos-test');
const outbox = createOutbox();
/** The outbox the case at hand writes with (rows, or messages written to the WAL only). */
let writer = outbox;
let pollDb: TestDatabase;
// The WAL mode's run: a throw-away server with wal_level = logical (the one on 5432 has replica).
let walServer: PgServer | undefined;
let walRoot: string | undefined;
const walDbs: Db[] = [];
/** The database the test at hand writes to. */
let tdb: { db: Db; url: string };

beforeAll(async () => {
  pollDb = await createTestDatabase('relay_chaos', { max: 12 });
});
afterAll(async () => {
  await pollDb.drop();
  for (const d of walDbs) await d.destroy();
  await walServer?.stop();
  if (walRoot) rmSync(walRoot, { recursive: true, force: true });
});

async function logicalDatabase(): Promise<{ db: Db; url: string }> {
  if (!walServer) {
    walRoot = mkdtempSync(join(tmpdir(), 'cairn-relay-chaos-'));
    walServer = await startPrimary(walRoot, 'wal', { walLevel: 'logical' });
  }
  const name = `chaos_${randomBytes(3).toString('hex')}`;
  await walServer.query(`CREATE DATABASE ${name}`);
  const url = walServer.url(name);
  const db = createDb({ connectionString: url, max: 12 });
  walDbs.push(db);
  await migrateToLatest(db);
  return { db, url };
}

/** `writers` concurrent writers, each owning keys/writers keys, one message per transaction, seq rising per key. */
async function writeLoad(topic: string, writers: number, keys: number, perKey: number, prefix = 'key') {
  const sent = new Map<string, string>(); // message_id -> "key:seq"
  await Promise.all(
    Array.from({ length: writers }, async (_, w) => {
      const mine = Array.from({ length: keys / writers }, (_, i) => `${prefix}-${w}-${i}`);
      for (let seq = 0; seq < perKey; seq++) {
        for (const key of mine) {
          const [id] = await tdb.db
            .transaction()
            .execute((t) => writer.enqueue(t, [{ topic, key, payload: { key, seq } }]));
          sent.set(id!, `${key}:${seq}`);
        }
      }
    }),
  );
  return sent;
}

/** Per key, the first time each message_id was seen must be in seq order; every duplicate repeats an id. */
function checkDelivery(sent: Map<string, string>, got: ReadMessage[]) {
  const firstSeen = new Map<string, number[]>();
  const seen = new Set<string>();
  let duplicates = 0;
  for (const m of got) {
    const id = m.headers['cairn-message-id']!;
    const { key, seq } = JSON.parse(m.value) as { key: string; seq: number };
    expect(sent.get(id), `unknown message ${id}`).toBe(`${key}:${seq}`);
    if (seen.has(id)) {
      duplicates++;
      continue;
    }
    seen.add(id);
    const list = firstSeen.get(key) ?? [];
    list.push(seq);
    firstSeen.set(key, list);
  }
  const missing = [...sent.keys()].filter((id) => !seen.has(id));
  expect(missing, 'lost messages').toEqual([]);
  for (const [key, seqs] of firstSeen) {
    expect(seqs, `order of ${key}`).toEqual([...seqs].sort((a, b) => a - b));
  }
  return { duplicates };
}

async function currentLsn(): Promise<string> {
  const { rows } = await sql<{ lsn: string }>`SELECT pg_current_wal_lsn()::text AS lsn`.execute(tdb.db);
  return rows[0]!.lsn;
}

async function slotConfirmedPast(lsn: string): Promise<boolean | undefined> {
  const { rows } = await sql<{ past: boolean }>`
    SELECT confirmed_flush_lsn >= ${lsn}::pg_lsn AS past FROM pg_replication_slots
     WHERE database = current_database() AND slot_name LIKE 'cairn_relay%'`.execute(tdb.db);
  return rows[0]?.past;
}

async function outboxEmpty(): Promise<boolean> {
  const r = await tdb.db
    .selectFrom('outbox')
    .select((eb) => eb.fn.countAll<number>().as('n'))
    .executeTakeFirstOrThrow();
  return Number(r.n) === 0;
}

describe('relay under crashes (real processes, real broker)', () => {
  it.each([
    ['polling', {}],
    ['WAL (one relay streams the slot, a killed one hands it over)', { CAIRN_RELAY_MODE: 'wal' }],
    // Slots are named per server: this case's database has a slot of its own.
    [
      'WAL messages (no table row: the slot is their only copy until acked)',
      { CAIRN_RELAY_MODE: 'wal', CAIRN_RELAY_WAL_SLOT: 'cairn_relay_messages' },
    ],
  ] as const)(
    '%s: 3 relay processes, 8 writers on 200 keys, relays SIGKILLed again and again (also between publish and delete): nothing lost, per-key order kept, duplicates only with the same message_id',
    async (mode, modeEnv) => {
      tdb = mode === 'polling' ? pollDb : await logicalDatabase();
      const messages = mode.startsWith('WAL messages');
      writer = messages ? createOutbox({ walMessages: true }) : outbox;
      const topic = await createTestTopic('relay-chaos', 6);
      const env = (name: string, extra: Record<string, string> = {}) => ({
        ...modeEnv,
        DATABASE_URL: tdb.url,
        KAFKA_BROKERS: kafkaBrokers().join(','),
        CAIRN_RELAY_INSTANCE: name,
        CAIRN_RELAY_LEASE_TTL_MS: '1500',
        CAIRN_RELAY_BATCH: '50',
        CAIRN_RELAY_MAX_IDLE_MS: '50',
        ...extra,
      });
      let generation = 0;
      let writing = true;
      // Every incarnation of relay 0 kills itself right after the broker acked its 3rd batch,
      // before deleting it: the named crash point "between publish and delete".
      const start = (slot: number) =>
        spawnTs(
          `relay-${slot}`,
          'relay/main.ts',
          env(`relay-${slot}-g${generation++}`, slot === 0 ? { CAIRN_FAULT_KILL_AFTER_PUBLISH: '3' } : {}),
        );
      const relays: Child[] = [start(0), start(1), start(2)];
      // Whenever relay 0 dies at its named point, start the next incarnation (which will too).
      let selfKills = 0;
      let restarting = true;
      const restartSlot0 = (child: Child): void => {
        void child.exited.then(() => {
          if (!restarting || relays[0] !== child || child.proc.signalCode !== 'SIGKILL') return;
          selfKills++;
          relays[0] = start(0);
          restartSlot0(relays[0]);
        });
      };
      restartSlot0(relays[0]!);

      let kills = 0;
      const chaos = (async () => {
        while (writing || kills < 6) {
          await new Promise((r) => setTimeout(r, 700)); // the pace of the faults, not a wait for a condition
          const slot = 1 + (kills % 2);
          await sigkill(relays[slot]!);
          kills++;
          relays[slot] = start(slot);
        }
      })();
      if (messages) {
        // A message is refused until a relay registered its slot as a reader.
        await waitFor(
          'a relay to register the slot',
          async () =>
            (
              await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox_wal_reader w
                JOIN pg_replication_slots s USING (slot_name)`.execute(tdb.db)
            ).rows[0]!.n > 0,
          60_000,
        );
      }
      const walBefore = await currentLsn();
      const sent = await writeLoad(topic, 8, 200, 15); // 3,000 messages
      // Relay 0 dies after its third batch; once the load is done an incarnation may get none
      // (with WAL messages, another relay that took the slot sends what it had not confirmed):
      // a little more load, until it died twice.
      for (let round = 0, until = Date.now() + 60_000; selfKills < 2 && Date.now() < until; round++) {
        for (const [id, v] of await writeLoad(topic, 2, 20, 3, `extra${round}`)) sent.set(id, v);
      }
      writing = false;
      await chaos;
      await waitFor('relay 0 to die at its named point twice', () => selfKills >= 2, 60_000);
      restarting = false;

      await waitFor('the outbox to drain', outboxEmpty, 90_000);
      const got = await readTopic(
        kafka,
        topic,
        (ms) => new Set(ms.map((m) => m.headers['cairn-message-id'])).size >= sent.size,
        60_000,
      );
      const { duplicates } = checkDelivery(sent, got);
      console.log(
        `relay chaos (${mode}): ${sent.size} sent, ${got.length} received, ${duplicates} duplicates, ${kills} SIGKILLs + ${selfKills} kills between publish and delete`,
      );
      if (mode !== 'polling') {
        // A relay streamed the slot and confirmed it past the load (not only swept the table).
        await waitFor(
          'the slot to be confirmed past the writes',
          async () => (await slotConfirmedPast(walBefore)) === true,
          60_000,
        );
      }
      expect(selfKills).toBeGreaterThanOrEqual(2);
      expect(kills).toBeGreaterThanOrEqual(6);
      // The self-kill between publish and delete guarantees at least one republished batch.
      expect(duplicates).toBeGreaterThan(0);
      await Promise.all(relays.map((r) => sigterm(r)));
    },
  );

  it('broker stopped for 10 seconds and started again: the relay recovers by itself and delivers everything', async (ctx) => {
    if (!inject('kafkaLocal')) ctx.skip(); // only the broker this run started may be stopped
    tdb = pollDb;
    writer = outbox;
    const topic = await createTestTopic('relay-broker-restart', 3);
    const relay = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      leaseTtlMs: 3000,
      maxIdleMs: 50,
    });
    const running = relay.run();
    const first = await writeLoad(topic, 4, 40, 5);
    await waitFor('the first messages to drain', outboxEmpty, 30_000);

    await stopLocalKafka();
    const whileDown = await writeLoad(topic, 4, 40, 5, 'down');
    await new Promise((r) => setTimeout(r, 10_000)); // the outage the test is about: 10 s without a broker
    expect(await outboxEmpty()).toBe(false);
    await startLocalKafka(() => {});

    await waitFor('the outbox to drain after the broker came back', outboxEmpty, 120_000);
    await relay.stop();
    await running;
    const sent = new Map([...first, ...whileDown]);
    const got = await readTopic(
      kafka,
      topic,
      (ms) => new Set(ms.map((m) => m.headers['cairn-message-id'])).size >= sent.size,
      60_000,
    );
    checkDelivery(sent, got);
    console.log(
      `broker restart: ${sent.size} sent, ${got.length} received, relay retries ${relay.stats().retries}`,
    );
  });
});
