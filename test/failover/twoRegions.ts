import { sql } from 'kysely';
import { afterAll, beforeAll } from 'vitest';
import { createRelay } from '../../relay/relay.js';
import type { Db } from '../../src/db/database.js';
import { createKafkaAdmin } from '../../src/kafka/admin.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createTestDatabase, kafkaBrokers, type TestDatabase } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

/** Both regions' stores write documents at this time: the same changes give the same rows (B is A's replica). */
export const clock = () => new Date('2026-12-01T00:00:00.000Z');

/**
 * Region A and region B as two databases for a test file, made before its tests and dropped
 * after, and the admin client region B reads the broker with (the client CAIRN_KAFKA_CLIENT names).
 */
export function useTwoRegions(label: string) {
  let a: TestDatabase | undefined;
  let b: TestDatabase | undefined;
  const reader = createKafkaAdmin({ brokers: kafkaBrokers(), clientId: `${label}-reader` });
  beforeAll(async () => {
    [a, b] = await Promise.all([createTestDatabase(`${label}_a`), createTestDatabase(`${label}_b`)]);
  });
  afterAll(async () => {
    await reader.close();
    await a?.drop();
    await b?.drop();
  });
  return {
    get a(): TestDatabase {
      return a!;
    },
    get b(): TestDatabase {
      return b!;
    },
    reader,
  };
}

/** Runs a relay on `db` until its outbox is empty, then stops it. */
export async function publishAll(db: Db, what = 'the outbox'): Promise<void> {
  const relay = createRelay({ db, publisher: createKafkaPublisher({ brokers: kafkaBrokers() }) });
  const running = relay.run();
  try {
    await waitFor(
      `${what} to be published`,
      async () =>
        (await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox`.execute(db)).rows[0]!.n === 0,
    );
  } finally {
    await relay.stop();
    await running;
  }
}
