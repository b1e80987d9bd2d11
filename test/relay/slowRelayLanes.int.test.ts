/**
 * A relay slow (not dead) past its lane lease in the middle of a step, while another relay
 * takes the lane and sends the key's messages on: what the slow one does on waking (review of
 * the fenced park). Each test failed before its fix:
 * - frozen at a park of its batch: it then sent the batch's other messages, of a lane it had
 *   lost, after the new owner's (the topic read m1, m2, m1);
 * - a send retried past the lease (the broker slow, then a dropped connection): the retry went
 *   out after the new owner's messages (m1, m2, m1);
 * - Postgres lost while the leases were renewed in an isolation: reported as the broker's
 *   failure ("publish failed", the relay then waiting for Kafka, its producer started afresh).
 *
 * Another relay takes only m's lane: 31 more live relays (rows of relay_instance) leave each
 * relay a share of one lane, and m's is handed to it directly, so k's lane stays run out and
 * untaken (a park there still holds: nobody else sent from it).
 */
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRelayWithTestHooks, type Relay, type RelayOptions } from '../../relay/relay.js';
import type { RelayTestHooks } from '../../relay/types.js';
import { createKafkaPublisher, kafkaClient, type Publisher } from '../../src/kafka/publisher.js';
import { laneOf } from '../../src/outbox/lanes.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { waitForLaneExpiry } from '../support/leases.js';
import { pausePoint } from '../support/pausePoint.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';

let tdb: TestDatabase;
const outbox = createOutbox();
const relays: Array<{ relay: Relay; done: Promise<void> }> = [];

beforeAll(async () => {
  tdb = await createTestDatabase('slow_relay_lanes');
});
afterAll(async () => {
  await stopAll();
  await tdb?.drop();
});

async function stopAll(): Promise<void> {
  for (const r of relays.splice(0)) {
    await r.relay.stop();
    await r.done.catch(() => {});
  }
  await tdb.db.deleteFrom('outbox').execute();
  await tdb.db.deleteFrom('outbox_parked_key').execute();
  await sql`DELETE FROM relay_instance`.execute(tdb.db);
  await sql`UPDATE relay_lane SET owner = NULL, expires_at = '-infinity'`.execute(tdb.db);
}

function start(options: Partial<RelayOptions> & { instanceId: string }, hooks: RelayTestHooks = {}): Relay {
  const relay = createRelayWithTestHooks(
    {
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      leaseTtlMs: 1000,
      ...options,
    },
    hooks,
  );
  relays.push({ relay, done: relay.run() });
  return relay;
}

const enqueue = (topic: string, key: string, n: number, bytes = 10) =>
  tdb.db
    .transaction()
    .execute(
      async (t) =>
        (await outbox.enqueue(t, [{ topic, key, payload: Buffer.from(`${n}:`.padEnd(bytes, 'x')) }]))[0]!,
    );

const laneExpired = (key: string) => waitForLaneExpiry(tdb.db, key);

/** r2 takes m's lane only, then sends m1 and m2 (m2 enqueued once m1 is gone); m2's id. */
async function anotherRelaySendsM(topic: string, instanceId: string): Promise<string> {
  await sql`INSERT INTO relay_instance (instance_id, last_seen)
            SELECT 'fake-' || g, now() + interval '1 hour' FROM generate_series(1, 31) g`.execute(tdb.db);
  await sql`UPDATE relay_lane SET owner = ${instanceId}, fencing_token = fencing_token + 1,
                   expires_at = now() + interval '1 minute'
             WHERE lane = ${laneOf('m')}`.execute(tdb.db);
  start({ instanceId });
  const noneOfM = async () =>
    (await tdb.db.selectFrom('outbox').select('id').where('key', '=', 'm').execute()).length === 0;
  await waitFor('r2 to deliver m1', noneOfM);
  const m2 = await enqueue(topic, 'm', 2);
  await waitFor('r2 to deliver m2', noneOfM);
  return m2;
}

/** m's messages on the topic, in order, once r2 has sent a third after everything r1 did. */
async function mOnTopic(topic: string, names: Record<string, string>): Promise<string[]> {
  const m3 = await enqueue(topic, 'm', 3);
  const seen = await readTopic(kafkaClient(kafkaBrokers(), 'slow-relay-lanes-read'), topic, (ms) =>
    ms.some((x) => x.headers['cairn-message-id'] === m3),
  );
  return seen.map((x) => names[x.headers['cairn-message-id']!] ?? 'm3');
}

describe('a relay slow past its lane lease in the middle of a step', () => {
  it('frozen at a park of its batch, does not send on waking the messages of a lane another relay took', async () => {
    expect(laneOf('m')).not.toBe(laneOf('k'));
    const topic = await createTestTopic('slow-lanes-park', 1);
    // A row that can never be encoded (an empty topic: a tenant's row from before 0017), key k.
    await sql`ALTER TABLE outbox DROP CONSTRAINT outbox_topic_name`.execute(tdb.db);
    const { rows } = await sql<{ message_id: string }>`
      INSERT INTO outbox (lane, message_id, topic, key, payload)
      VALUES (${laneOf('k')}, gen_random_uuid(), '', 'k', '\\x00') RETURNING message_id::text`.execute(
      tdb.db,
    );
    await sql`ALTER TABLE outbox ADD CONSTRAINT outbox_topic_name
              CHECK (topic ~ '^[A-Za-z0-9._-]{1,249}$' AND topic NOT IN ('.', '..')) NOT VALID`.execute(
      tdb.db,
    );
    const bad = rows[0]!.message_id;
    const m1 = await enqueue(topic, 'm', 1);
    const freeze = pausePoint();
    const r1 = start(
      { instanceId: 'r1' },
      {
        beforePark: async (id) => {
          if (id === bad) await freeze.hold();
        },
      },
    );
    await freeze.reached; // r1 claimed [bad, m1] and is about to park k
    await laneExpired('m');
    await laneExpired('k');
    const m2 = await anotherRelaySendsM(topic, 'r2');
    freeze.release();
    await waitFor('r1 to end its batch', async () => r1.stats().batches > 0, 10_000);
    expect(await mOnTopic(topic, { [m1]: 'm1', [m2]: 'm2' })).toEqual(['m1', 'm2', 'm3']);
  });

  it('retrying a send past its lease in an isolation, does not send it after the new owner sent the key on', async () => {
    await stopAll();
    const topic = await createTestTopic('slow-lanes-retry', 1, { 'max.message.bytes': '1024' });
    await enqueue(topic, 'k', 0, 4000); // refused: the batch is isolated
    const m1 = await enqueue(topic, 'm', 1);
    const slow = pausePoint();
    const real = createKafkaPublisher({ brokers: kafkaBrokers() });
    let stalled = false;
    // The broker is slow, then drops the connection, on r1's first isolated send of m1 (a
    // broker restarting mid-isolation); a retry would go through.
    const flaky: Publisher = {
      address: real.address,
      connect: () => real.connect(),
      disconnect: () => real.disconnect(),
      async publish(msgs) {
        if (!stalled && msgs.length === 1 && msgs[0]!.key === 'm') {
          stalled = true;
          await slow.hold();
          throw Object.assign(new Error('Connection timeout'), {
            name: 'KafkaJSConnectionError',
            retriable: true,
          });
        }
        return real.publish(msgs);
      },
    };
    const r1 = start({ instanceId: 'r3', publisher: flaky });
    await slow.reached;
    await laneExpired('m');
    const m2 = await anotherRelaySendsM(topic, 'r4');
    slow.release();
    await waitFor('r1 to end its batch', async () => r1.stats().batches > 0, 10_000);
    expect(await mOnTopic(topic, { [m1]: 'm1', [m2]: 'm2' })).toEqual(['m1', 'm2', 'm3']);
  });

  it('losing Postgres while it renews its leases in an isolation, does not report a broker failure', async () => {
    await stopAll();
    const topic = await createTestTopic('slow-lanes-pg', 1, { 'max.message.bytes': '1024' });
    await enqueue(topic, 'k', 1, 4000); // refused: the batch is isolated
    const q = await enqueue(topic, 'q', 2);
    const gate = pausePoint();
    const lines: string[] = [];
    start(
      {
        instanceId: 'r5',
        leaseTtlMs: 3000,
        logger: pino({ level: 'warn' }, { write: (l: string) => void lines.push(l) }),
      },
      {
        beforeIsolatedPublish: async (id) => {
          if (id === q) await gate.hold();
        },
      },
    );
    await gate.reached; // k parked; q next
    // A renewal is due a third of the TTL after the last (the relay's own clock).
    await new Promise((r) => setTimeout(r, 1100));
    // The lanes' rows held, the renewal waits; then its connection ends (a server restarting).
    let unlock!: () => void;
    const unlocked = new Promise<void>((r) => {
      unlock = r;
    });
    const locked = pausePoint();
    const locker = tdb.db.transaction().execute(async (t) => {
      await sql`SELECT lane FROM relay_lane FOR UPDATE`.execute(t);
      void locked.hold();
      await unlocked;
    });
    await locked.reached;
    gate.release();
    await waitFor('the renewal to wait, and its connection to end', async () => {
      const { rows } = await sql<{ n: number }>`
        SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
         WHERE query LIKE '%UPDATE relay_lane SET expires_at%' AND wait_event_type = 'Lock'
           AND pid <> pg_backend_pid()`.execute(tdb.db);
      return rows[0]!.n > 0;
    });
    unlock();
    await locker;
    await waitFor('the step to fail', async () => lines.some((l) => /relay iteration failed/.test(l)));
    const failed = lines.find((l) => /relay iteration failed/.test(l))!;
    // Observed before: "publish failed: terminating connection due to administrator command".
    expect(JSON.parse(failed).err).toMatch(/^could not renew the relay's lanes: terminating connection/);
  });
});
