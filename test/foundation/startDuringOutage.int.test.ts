import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox } from '../../src/outbox/outbox.js';
import { createEffectsTable, effectStats } from '../inbox/fixtures.js';
import { type Child, sigterm, spawnTs } from '../support/processes.js';
import { freePort, startTcpProxy } from '../support/tcpProxy.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

let tdb: TestDatabase;

beforeAll(async () => {
  tdb = await createTestDatabase('start_outage', { max: 4 });
  await createEffectsTable(tdb.db);
});
afterAll(async () => {
  await tdb.drop();
});

/** Enqueues `n` messages on `topic`, one key each: the relay must publish them, the consumer apply them. */
async function enqueue(topic: string, n: number): Promise<string[]> {
  const outbox = createOutbox();
  return tdb.db.transaction().execute((t) =>
    outbox.enqueue(
      t,
      Array.from({ length: n }, (_, seq) => ({ topic, key: `k${seq}`, payload: { key: `k${seq}`, seq } })),
    ),
  );
}

async function outboxRows(): Promise<number> {
  const r = await tdb.db
    .selectFrom('outbox')
    .select((eb) => eb.fn.countAll<number>().as('n'))
    .executeTakeFirstOrThrow();
  return Number(r.n);
}

async function get(port: number, path: string): Promise<{ status: number; body: string }> {
  const res = await fetch(`http://127.0.0.1:${port}${path}`);
  return { status: res.status, body: await res.text() };
}

/**
 * A relay and an inbox consumer process are started with `dependency` pointing at a port
 * nothing listens on. They must stay up, say what they wait for (log line with the address,
 * /readyz 503, the waiting gauge at 1) and publish nothing; once a proxy to the real server
 * listens on that port, every message goes outbox -> Kafka -> consumer exactly once.
 */
async function startDuringOutage(dependency: 'postgres' | 'kafka') {
  const topic = await createTestTopic(`outage-${dependency}`, 3);
  const group = `${topic}.g`;
  const ids = await enqueue(topic, 40);
  const downPort = await freePort();
  const [relayMetrics, consumerMetrics] = [await freePort(), await freePort()];
  const realUrl = new URL(tdb.url);
  const downUrl = new URL(tdb.url);
  downUrl.host = `127.0.0.1:${downPort}`;
  const realBroker = kafkaBrokers()[0]!;
  const env = {
    DATABASE_URL: dependency === 'postgres' ? downUrl.toString() : tdb.url,
    KAFKA_BROKERS: dependency === 'kafka' ? `127.0.0.1:${downPort}` : kafkaBrokers().join(','),
  };
  const children: Child[] = [];
  const relay = spawnTs('relay', 'relay/main.ts', {
    ...env,
    CAIRN_RELAY_INSTANCE: `outage-${dependency}`,
    CAIRN_RELAY_MAX_IDLE_MS: '50',
    CAIRN_METRICS_PORT: String(relayMetrics),
  });
  children.push(relay);
  const consumer = spawnTs('consumer', 'test/support/effectConsumer.ts', {
    ...env,
    GROUP: group,
    TOPIC: topic,
    CAIRN_METRICS_PORT: String(consumerMetrics),
  });
  children.push(consumer);
  let proxy: Awaited<ReturnType<typeof startTcpProxy>> | undefined;
  try {
    const address = dependency === 'kafka' ? `127.0.0.1:${downPort}` : `127.0.0.1:${downPort}/${tdb.name}`;
    for (const child of children) {
      await waitFor(
        `${child.name} to log that it waits for ${dependency}`,
        () => child.output().includes(`waiting for ${dependency} at`) && child.output().includes(address),
        30_000,
      );
      expect(child.proc.exitCode, child.output()).toBeNull();
    }
    // Waiting, not ready, and saying so on /metrics.
    expect(await get(relayMetrics, '/readyz')).toEqual({ status: 503, body: 'not ready\n' });
    expect(await get(consumerMetrics, '/readyz')).toEqual({ status: 503, body: 'not ready\n' });
    expect((await get(relayMetrics, '/metrics')).body).toContain(
      `cairn_relay_waiting_for{dependency="${dependency}"} 1`,
    );
    expect((await get(consumerMetrics, '/metrics')).body).toContain(
      `cairn_inbox_waiting_for{group="${group}",dependency="${dependency}"} 1`,
    );
    expect(await outboxRows()).toBe(ids.length);

    // The dependency comes back at the address the processes were given.
    const [host, port] =
      dependency === 'kafka' ? realBroker.split(':') : [realUrl.hostname, realUrl.port || '5432'];
    proxy = await startTcpProxy(downPort, { host: host!, port: Number(port) });

    await waitFor('the outbox to drain', async () => (await outboxRows()) === 0, 45_000);
    await waitFor(
      'every message applied by the consumer',
      async () => (await effectStats(tdb.db)).distinct_ids >= ids.length,
      45_000,
    );
    expect(await effectStats(tdb.db)).toEqual({ total: ids.length, distinct_ids: ids.length, doubled: 0 });
    expect((await get(relayMetrics, '/readyz')).status).toBe(200);
    expect((await get(consumerMetrics, '/readyz')).status).toBe(200);
    expect((await get(relayMetrics, '/metrics')).body).toContain(
      `cairn_relay_waiting_for{dependency="${dependency}"} 0`,
    );
    for (const child of children) expect(await sigterm(child), child.output()).toBe(0);
  } finally {
    for (const child of children) await sigterm(child, 5000);
    await proxy?.close();
    await sql`TRUNCATE effects`.execute(tdb.db);
  }
}

describe('relay and consumers started during an outage wait for it, then deliver everything', () => {
  it('broker down at start: relay and consumer wait, report unready, and deliver every message once it is up', async () => {
    await startDuringOutage('kafka');
  });

  it('Postgres down at start: relay and consumer wait, report unready, and deliver every message once it is up', async () => {
    await startDuringOutage('postgres');
  });

  it('SIGTERM while waiting for a dependency that never comes: relay and consumer exit 0 promptly', async () => {
    const relay = spawnTs('relay', 'relay/main.ts', {
      DATABASE_URL: tdb.url,
      KAFKA_BROKERS: `127.0.0.1:${await freePort()}`,
    });
    const down = new URL(tdb.url);
    down.host = `127.0.0.1:${await freePort()}`;
    const consumer = spawnTs('consumer', 'test/support/effectConsumer.ts', {
      DATABASE_URL: down.toString(),
      KAFKA_BROKERS: kafkaBrokers().join(','),
      GROUP: 'never',
      TOPIC: 'never',
    });
    await waitFor(
      'the relay to wait for kafka',
      () => relay.output().includes('waiting for kafka at'),
      30_000,
    );
    await waitFor(
      'the consumer to wait for postgres',
      () => consumer.output().includes('waiting for postgres at'),
      30_000,
    );
    expect(await sigterm(relay, 10_000), relay.output()).toBe(0);
    expect(await sigterm(consumer, 10_000), consumer.output()).toBe(0);
  });
});
