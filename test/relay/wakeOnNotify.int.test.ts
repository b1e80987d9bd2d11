import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRelay } from '../../relay/relay.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

let tdb: TestDatabase;
beforeAll(async () => {
  tdb = await createTestDatabase('wake_notify');
});
afterAll(async () => {
  await tdb.drop();
});

describe('relay wake-up by LISTEN/NOTIFY', () => {
  it('a relay asleep in a long idle poll publishes a notifying enqueue long before its next poll', async () => {
    const topic = await createTestTopic('wake', 1);
    const relay = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      maxIdleMs: 600_000,
      leaseTtlMs: 60_000, // idle sleeps are capped at a third of it
      wakeOnNotify: tdb.url,
    });
    const running = relay.run();
    try {
      // Idle polls double from 1 ms; once a sleep is 4 s long, polling alone would take seconds.
      await waitFor('the relay to back off to 4 s sleeps', () => relay.stats().idleMs >= 4096, 30_000);
      const outbox = createOutbox({ notify: true });
      await tdb.db
        .transaction()
        .execute((t) => outbox.enqueue(t, [{ topic, key: 'k', payload: { hello: 1 } }]));
      await waitFor('the message to be published', () => relay.stats().published === 1, 2500);
      expect(relay.stats().published).toBe(1);
    } finally {
      await relay.stop();
      await running;
    }
  });
});
