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

/** How many consumers have applied effects so far. */
async function consumersApplying(): Promise<number> {
  const { rows } = await sql<{ n: number }>`SELECT count(DISTINCT consumer)::int AS n FROM effects`.execute(
    tdb.db,
  );
  return rows[0]!.n;
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
    // 6,000 messages over ~10 s or more, so consumers join and die while it flows: it goes on
    // until a second consumer applied some (beside another crash test, joining once took longer
    // than 10 s and one consumer applied everything: "expected 1 to be >= 2").
    const producing = produceKeyed(kafkaBrokers(), topic, 60, 100, 100, {
      until: async () => (await consumersApplying()) >= 2,
      maxPerKey: 1000,
    });
    const children: Child[] = [
      spawnTs('c1', 'test/support/effectConsumer.ts', consumerEnv(topic, group, 'c1', { CHUNK_SIZE: '20' })),
    ];
    await waitFor('the first effects', async () => (await effectCount()) > 300, 60_000);
    children.push(
      spawnTs('c2', 'test/support/effectConsumer.ts', consumerEnv(topic, group, 'c2', { CHUNK_SIZE: '20' })),
    );
    children.push(
      spawnTs('c3', 'test/support/effectConsumer.ts', consumerEnv(topic, group, 'c3', { CHUNK_SIZE: '20' })),
    );
    await waitFor('more effects after the join', async () => (await effectCount()) > 3000, 60_000);
    await sigkill(children[1]!);
    const ids = await producing;
    await waitFor('all effects', async () => (await effectCount()) >= ids.length, 120_000);
    await Promise.all([sigterm(children[0]!), sigterm(children[2]!)]);

    const stats = await effectStats(tdb.db);
    const byConsumer = await tdb.db
      .selectFrom('effects' as never)
      .select(['consumer' as never, (eb) => eb.fn.countAll<number>().as('n')])
      .groupBy('consumer' as never)
      .execute();
    console.log(`rebalance: ${JSON.stringify(stats)}, by consumer ${JSON.stringify(byConsumer)}`);
    expect(stats).toEqual({ total: ids.length, distinct_ids: ids.length, doubled: 0 });
    expect(byConsumer.length).toBeGreaterThanOrEqual(2);
    expect(await keysOutOfOrder(tdb.db)).toEqual([]);
  });
});
