import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Child, sigkill, sigterm, spawnTs } from '../support/processes.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';
import { createEffectsTable, effectStats, keysOutOfOrder, produceKeyed } from './fixtures.js';

let tdb: TestDatabase;

beforeAll(async () => {
  tdb = await createTestDatabase('inbox_chaos', { max: 6 });
  await createEffectsTable(tdb.db);
});
afterAll(async () => {
  await tdb.drop();
});

function consumerEnv(topic: string, group: string, name: string, extra: Record<string, string> = {}) {
  return {
    DATABASE_URL: tdb.url,
    KAFKA_BROKERS: kafkaBrokers().join(','),
    GROUP: group,
    TOPIC: topic,
    CONSUMER_NAME: name,
    ...extra,
  };
}

async function effectCount(): Promise<number> {
  return (await effectStats(tdb.db)).distinct_ids;
}

/** How many effects each consumer has applied so far. */
async function appliedBy(): Promise<Map<string, number>> {
  const { rows } = await sql<{ consumer: string; n: number }>`
    SELECT consumer, count(*)::int AS n FROM effects GROUP BY consumer`.execute(tdb.db);
  return new Map(rows.map((r) => [r.consumer, r.n]));
}

describe('inbox consumers under crashes (real processes)', () => {
  it('SIGKILL right after the database commit and before the offset commit, again and again over 10,000 messages: every effect exactly once', async () => {
    const topic = await createTestTopic('inbox-chaos', 3);
    const group = `${topic}.g`;
    const ids = await produceKeyed(kafkaBrokers(), topic, 100, 100); // 10,000 messages
    let kills = 0;
    let generation = 0;
    // Each incarnation dies right after its 8th to 14th database commit (chunks of 100): the
    // offset of that chunk is never committed, so the next incarnation receives it again.
    for (;;) {
      const child = spawnTs(
        'consumer',
        'test/support/effectConsumer.ts',
        consumerEnv(topic, group, `c${generation}`, {
          CAIRN_FAULT_KILL_AFTER_DB_COMMIT: String(8 + ((generation * 3) % 7)),
          CHUNK_SIZE: '100',
        }),
      );
      generation++;
      const outcome = await Promise.race([
        child.exited.then(() => 'died' as const),
        waitFor('all effects', async () => (await effectCount()) >= ids.length, 15_000).then(
          () => 'done' as const,
          () => 'slow' as const,
        ),
      ]);
      if (child.proc.signalCode === 'SIGKILL') kills++;
      if (outcome === 'done') {
        await sigkill(child);
        break;
      }
      if (outcome === 'slow') await sigkill(child);
      expect(generation, 'too many generations without progress').toBeLessThan(60);
    }
    const stats = await effectStats(tdb.db);
    console.log(
      `inbox crash: ${ids.length} messages, ${kills} SIGKILLs after commit, effects ${JSON.stringify(stats)}`,
    );
    expect(kills).toBeGreaterThanOrEqual(5);
    expect(stats).toEqual({ total: ids.length, distinct_ids: ids.length, doubled: 0 });
    expect(await keysOutOfOrder(tdb.db)).toEqual([]);
  });

  it('consumers joining mid-stream and one killed: every effect exactly once, order per key kept', async () => {
    await tdb.db.deleteFrom('effects' as never).execute();
    const topic = await createTestTopic('inbox-chaos', 6);
    const group = `${topic}.g`;
    // 6,000 messages over ~10 s at least, so consumers join and die while it flows. It goes on
    // until c2 was killed and every consumer applied some (at most 60,000): beside another crash
    // test joining once took longer than 10 s, and one consumer applied everything.
    let killed = false;
    let stop = false;
    let produced = false;
    const producing = produceKeyed(kafkaBrokers(), topic, 60, 100, 100, {
      until: async () => stop || (killed && (await appliedBy()).size >= 3),
      maxPerKey: 1000,
    }).finally(() => {
      produced = true;
    });
    const children: Child[] = [
      spawnTs('c1', 'test/support/effectConsumer.ts', consumerEnv(topic, group, 'c1', { CHUNK_SIZE: '20' })),
    ];
    try {
      await waitFor('the first effects', async () => (await effectCount()) > 300, 60_000);
      children.push(
        spawnTs(
          'c2',
          'test/support/effectConsumer.ts',
          consumerEnv(topic, group, 'c2', { CHUNK_SIZE: '20' }),
        ),
      );
      children.push(
        spawnTs(
          'c3',
          'test/support/effectConsumer.ts',
          consumerEnv(topic, group, 'c3', { CHUNK_SIZE: '20' }),
        ),
      );
      // c2 dies holding partitions, having applied some: a consumer lost mid-stream, not before it joined.
      await waitFor('c2 to apply messages', async () => ((await appliedBy()).get('c2') ?? 0) > 0, 120_000);
      expect(produced, 'the stream still flows when c2 is killed').toBe(false);
      await sigkill(children[1]!);
      killed = true;
      const ids = await producing;
      await waitFor('all effects', async () => (await effectCount()) >= ids.length, 120_000);
      await Promise.all([sigterm(children[0]!), sigterm(children[2]!)]);

      const stats = await effectStats(tdb.db);
      const byConsumer = await appliedBy();
      console.log(`rebalance: ${JSON.stringify(stats)}, by consumer ${JSON.stringify([...byConsumer])}`);
      expect(stats).toEqual({ total: ids.length, distinct_ids: ids.length, doubled: 0 });
      expect([...byConsumer.keys()].sort()).toEqual(['c1', 'c2', 'c3']);
      expect(await keysOutOfOrder(tdb.db)).toEqual([]);
    } finally {
      stop = true; // a failed wait leaves no stream running into the dropped database
      await producing.catch(() => {});
      await Promise.all(children.map((c) => sigkill(c)));
    }
  });
});
