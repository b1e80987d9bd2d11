import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { relayMetrics } from '../../relay/metrics.js';
import { createRelay, type Relay } from '../../relay/relay.js';
import {
  createKafkaPublisher,
  kafkaClient,
  type Publisher,
  type PublishMessage,
} from '../../src/kafka/publisher.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';
import { useLogicalServer } from '../support/walServer.js';

/**
 * A relay that alone cannot reach the broker (its network, a producer stuck), while another
 * relay can: it used to keep its lanes, renewing them in Postgres, and their messages waited
 * for good. Now it gives them to the other live relay after twice the lease TTL without a
 * batch acknowledged. The fault is injected at the Publisher seam of relay A: a real kafkajs
 * publisher whose sends fail as a refused connection would; relay B publishes to the real broker.
 */
let tdb: TestDatabase;
let topic: string;
const outbox = createOutbox();
const walOutbox = createOutbox({ walMessages: true });
const wal = useLogicalServer('stepaside');

beforeAll(async () => {
  tdb = await createTestDatabase('relay_step_aside');
  topic = await createTestTopic('relay-step-aside', 3);
});
afterAll(async () => {
  await tdb?.drop();
});

/** What kafkajs throws when it cannot connect to the broker (injected: this relay cannot reach it). */
const connectionRefused = () =>
  Object.assign(new Error('Connection error: connect ECONNREFUSED (injected)'), {
    name: 'KafkaJSConnectionError',
    retriable: true,
  });

/** The real publisher, with a send failing with what `fail` returns for its messages (nothing: sent). */
function faulty(
  fail: (ms: readonly PublishMessage[]) => Promise<Error | undefined>,
): Publisher & { sends: number } {
  const real = createKafkaPublisher({ brokers: kafkaBrokers() });
  const p = {
    sends: 0,
    address: real.address,
    connect: () => real.connect(),
    disconnect: () => real.disconnect(),
    async publish(ms: readonly PublishMessage[]) {
      p.sends++;
      const err = await fail(ms);
      if (err) throw err;
      return real.publish(ms);
    },
  };
  return p;
}
const unreachable = () => faulty(async () => connectionRefused());
const published = (...rs: Relay[]) => rs.reduce((n, r) => n + r.stats().published, 0);
const twoRelays = (fail: Parameters<typeof faulty>[0], ids: [string, string]) =>
  ids.map((instanceId) =>
    createRelay({
      db: tdb.db,
      publisher: faulty(fail),
      instanceId,
      leaseTtlMs: 1500,
      publishRetries: 0,
      maxIdleMs: 20,
    }),
  ) as [Relay, Relay];

describe('a relay that cannot reach the broker while another can', () => {
  it('gives its lanes to the other relay: every message is published, none waits for it', async () => {
    const ttl = 1500;
    const failing = unreachable();
    const a = createRelay({
      db: tdb.db,
      publisher: failing,
      instanceId: 'a-cut-off',
      leaseTtlMs: ttl,
      publishRetries: 0,
      maxIdleMs: 20,
    });
    const b = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      instanceId: 'b-healthy',
      leaseTtlMs: ttl,
      maxIdleMs: 20,
    });
    const aDone = a.run();
    await waitFor('relay A to own every lane', () => a.stats().lanesOwned === 32, 10_000);
    const bDone = b.run();
    try {
      await waitFor('the lanes shared', () => a.stats().lanesOwned === 16 && b.stats().lanesOwned === 16);
      const ids = await tdb.db.transaction().execute((t) =>
        outbox.enqueue(
          t,
          Array.from({ length: 200 }, (_, i) => ({ topic, key: `k${i}`, payload: { i } })),
        ),
      );
      const kafka = kafkaClient(kafkaBrokers(), 'relay-step-aside-test');
      const got = await readTopic(
        kafka,
        topic,
        (ms) => new Set(ms.map((m) => m.headers['cairn-message-id'])).size >= 200,
        30_000,
      );
      expect(new Set(got.map((m) => m.headers['cairn-message-id']))).toEqual(new Set(ids));
      expect(failing.sends).toBeGreaterThan(0); // A did try its lanes first
      expect(a.stats().steppedAside).toBeGreaterThanOrEqual(1);
      expect(a.stats().published).toBe(0);
      expect(await relayMetrics(a, tdb.db).metrics()).toMatch(/^cairn_relay_stepped_aside_total [1-9]\d*$/m);
      await waitFor('the outbox empty', async () => {
        const left = await tdb.db.selectFrom('outbox').select('id').execute();
        return left.length === 0;
      });
    } finally {
      await a.stop();
      await b.stop();
      await Promise.all([aDone, bDone]);
    }
  });
});

describe('what is not a relay cut off from the broker (review)', () => {
  it('a broker answer about a message (a topic that does not exist) stays with its lane: no relay steps aside, the other lanes flow', async () => {
    const missing = `${topic}-no-such-topic`;
    const [a, b] = twoRelays(
      async (ms) =>
        ms.some((m) => m.topic === missing)
          ? Object.assign(new Error('This server does not host this topic-partition'), {
              type: 'UNKNOWN_TOPIC_OR_PARTITION',
              retriable: true,
            })
          : undefined,
      ['a-topic', 'b-topic'],
    );
    const done = [a.run(), b.run()];
    try {
      await waitFor(
        'the lanes shared',
        () => a.stats().lanesOwned === 16 && b.stats().lanesOwned === 16,
        15_000,
      );
      await tdb.db
        .transaction()
        .execute((t) => outbox.enqueue(t, [{ topic: missing, key: 'bad', payload: {} }]));
      await new Promise((r) => setTimeout(r, 4000)); // past twice the TTL of failures
      expect(a.stats().steppedAside + b.stats().steppedAside).toBe(0);
      const before = published(a, b);
      await tdb.db.transaction().execute((t) =>
        outbox.enqueue(
          t,
          Array.from({ length: 100 }, (_, i) => ({ topic, key: `good${i}`, payload: { i } })),
        ),
      );
      await waitFor(
        'the good messages of the other lanes published',
        () => published(a, b) - before >= 40,
        5000,
      );
    } finally {
      await a.stop();
      await b.stop();
      await Promise.all(done);
      await tdb.db.deleteFrom('outbox').execute();
    }
  });

  it('an outage both relays see at once: only one steps aside, and the other sends as soon as the broker is back', async () => {
    let down = false;
    let waiters: Array<() => void> = [];
    // While down, both relays' sends fail together (their failure clocks start at the same moment).
    const outage = async () => {
      if (!down) return undefined;
      await new Promise<void>((r) => {
        waiters.push(r);
        if (waiters.length >= 2) {
          for (const w of waiters) w();
          waiters = [];
        } else setTimeout(r, 1000);
      });
      return connectionRefused();
    };
    const [a, b] = twoRelays(outage, ['a-outage', 'b-outage']);
    const done = [a.run(), b.run()];
    try {
      await waitFor(
        'the lanes shared',
        () => a.stats().lanesOwned === 16 && b.stats().lanesOwned === 16,
        15_000,
      );
      down = true;
      await tdb.db.transaction().execute((t) =>
        outbox.enqueue(
          t,
          Array.from({ length: 200 }, (_, i) => ({ topic, key: `o${i}`, payload: { i } })),
        ),
      );
      await waitFor(
        'a relay to step aside',
        () => a.stats().steppedAside + b.stats().steppedAside > 0,
        15_000,
      );
      await new Promise((r) => setTimeout(r, 500));
      expect(a.stats().steppedAside + b.stats().steppedAside).toBe(1);
      down = false;
      const back = performance.now();
      await waitFor('every message published', () => published(a, b) >= 200, 20_000);
      expect(performance.now() - back).toBeLessThan(2500); // the other relay did not leave too (2x TTL away)
    } finally {
      await a.stop();
      await b.stop();
      await Promise.all(done);
    }
  });
});

describe('a WAL relay that cannot reach the broker while another can', () => {
  it('gives up the slot as well as its lanes: the other relay streams it and every WAL message is published', async () => {
    const d = await wal.database('aside');
    const walTopic = await createTestTopic('relay-step-aside-wal', 3);
    const failing = unreachable();
    const options = {
      db: d.db,
      leaseTtlMs: 1500,
      maxIdleMs: 20,
      wal: { connectionString: d.url, slot: d.slot },
    };
    const a = wal.start(
      createRelay({ ...options, publisher: failing, instanceId: 'a-cut-off', publishRetries: 0 }),
    );
    await waitFor(
      'relay A to stream the slot with every lane',
      () => wal.streaming(a) && a.stats().lanesOwned === 32,
      30_000,
    );
    const b = wal.start(
      createRelay({
        ...options,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        instanceId: 'b-healthy',
      }),
    );
    await waitFor('the lanes shared', () => a.stats().lanesOwned === 16 && b.stats().lanesOwned === 16);
    // Only the slot has these: the relay streaming it must publish them, or move them to the table.
    const ids = await d.db.transaction().execute((t) =>
      walOutbox.enqueue(
        t,
        Array.from({ length: 200 }, (_, i) => ({ topic: walTopic, key: `k${i}`, payload: { i } })),
      ),
    );
    const kafka = kafkaClient(kafkaBrokers(), 'relay-step-aside-wal-test');
    const got = await readTopic(
      kafka,
      walTopic,
      (ms) => new Set(ms.map((m) => m.headers['cairn-message-id'])).size >= 200,
      30_000,
    );
    expect(new Set(got.map((m) => m.headers['cairn-message-id']))).toEqual(new Set(ids));
    expect(failing.sends).toBeGreaterThan(0);
    expect(a.stats().steppedAside).toBeGreaterThanOrEqual(1);
    expect(a.stats().published).toBe(0);
    await waitFor('relay B streaming the slot', () => b.stats().wal?.streaming === true, 10_000);
  });
});

/**
 * Review: a relay cut off for good came back every 4 TTLs, because a step with nothing to send
 * (it has no lanes yet when it comes back) reset its backoff; and in WAL-messages mode, a step
 * whose streamed messages only moved to the table counted as a good one and reset the failure
 * clock. Messages keep arriving here, so relay A always has something to fail on.
 */
describe('a relay cut off for good, with messages arriving all the time', () => {
  async function awayTimes(
    mode: 'polling' | 'wal',
  ): Promise<{ away: number[]; a: Relay; b: Relay; stop: () => Promise<void> }> {
    const d = mode === 'wal' ? await wal.database('backoff') : undefined;
    const db = d?.db ?? tdb.db;
    const writer = mode === 'wal' ? walOutbox : outbox;
    const lines: string[] = [];
    const base = {
      db,
      leaseTtlMs: 500,
      maxIdleMs: 20,
      ...(d && { wal: { connectionString: d.url, slot: d.slot, sweepEveryMs: 100 } }),
    };
    const a = createRelay({
      ...base,
      publisher: unreachable(),
      instanceId: `a-${mode}-for-good`,
      publishRetries: 0,
      logger: pino({ level: 'warn' }, { write: (line: string) => void lines.push(line) }),
    });
    const b = createRelay({
      ...base,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      instanceId: `b-${mode}-healthy`,
    });
    const done = [a.run()];
    // A streams the slot first (WAL messages need a registered reader), then B shares the lanes.
    await waitFor(
      'relay A to own every lane',
      () => a.stats().lanesOwned === 32 && (!d || wal.streaming(a)),
      30_000,
    );
    done.push(b.run());
    let writing = true;
    const writes = (async () => {
      for (let i = 0; writing; i++) {
        await db
          .transaction()
          .execute((t) => writer.enqueue(t, [{ topic, key: `f${i % 64}`, payload: { i } }]));
        await new Promise((r) => setTimeout(r, 20));
      }
    })();
    const stop = async () => {
      writing = false;
      await writes;
      await a.stop();
      await b.stop();
      await Promise.all(done);
    };
    await waitFor('relay A to step aside three times', () => a.stats().steppedAside >= 3, 40_000).catch(
      async (err: unknown) => {
        await stop();
        throw err;
      },
    );
    const away = lines
      .map((l) => JSON.parse(l) as { for_ms?: number })
      .flatMap((l) => (l.for_ms === undefined ? [] : [l.for_ms]));
    return { away, a, b, stop };
  }

  for (const mode of ['polling', 'wal'] as const) {
    it(`${mode}: it stays away twice as long each time (2, 4, 8 TTLs), and the healthy relay sends`, async () => {
      const { away, a, b, stop } = await awayTimes(mode);
      try {
        expect(away.slice(0, 3)).toEqual([1000, 2000, 4000]);
        expect(a.stats().published).toBe(0);
        expect(b.stats().published).toBeGreaterThan(0);
      } finally {
        await stop();
      }
    });
  }
});
