import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRelay } from '../../relay/relay.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createOutbox, OUTBOX_CHANNEL } from '../../src/outbox/outbox.js';
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

  it("a flood of NOTIFY on the outbox's channel (any role may send one) costs no more claims than polling: a notice that brings no rows makes the next ones count less", async () => {
    const topic = await createTestTopic('wake-flood', 1);
    const relay = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      maxIdleMs: 200,
      leaseTtlMs: 60_000,
      wakeOnNotify: tdb.url,
    });
    const running = relay.run();
    const flooder = new pg.Client({ connectionString: tdb.url });
    await flooder.connect();
    try {
      await waitFor('the relay to back off to its longest sleep', () => relay.stats().idleMs >= 128, 30_000);
      const before = relay.stats().claims;
      const until = performance.now() + 2000;
      let sent = 0;
      while (performance.now() < until) {
        await flooder.query(`NOTIFY ${OUTBOX_CHANNEL}`);
        sent++;
      }
      const claims = relay.stats().claims - before;
      // Polling alone makes about 10 claims in 2 s at 200 ms; each notice answered made one each.
      expect(sent).toBeGreaterThan(500);
      expect(claims).toBeLessThan(60);
      // A real notice after the flood still wakes it: published before the next idle poll would.
      const outbox = createOutbox({ notify: true });
      await tdb.db
        .transaction()
        .execute((t) => outbox.enqueue(t, [{ topic, key: 'k', payload: { after: 1 } }]));
      await waitFor('the message to be published', () => relay.stats().published === 1, 2500);
    } finally {
      await flooder.end();
      await relay.stop();
      await running;
    }
  });
});
