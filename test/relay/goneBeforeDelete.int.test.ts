import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRelayWithTestHooks } from '../../relay/relay.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { pausePoint } from '../support/pausePoint.js';
import { twoTenants } from '../support/tenants.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

/**
 * A published row can be gone before the relay deletes it: an operator's `cairn outbox skip`
 * (or, before migration 0015, a tenant deleting its own outbox row with its own SQL).
 * That is not a lost lane: no "lost a lane" warning, no lost-lane counter a tenant could drive
 * into an operator's alerts, no rebalance. It is counted apart (goneBeforeDelete).
 */
let tdb: TestDatabase;
let topic: string;
const outbox = createOutbox();

beforeAll(async () => {
  tdb = await createTestDatabase('gone_before_delete');
  topic = await createTestTopic('gone-before-delete', 1);
});
afterAll(async () => {
  await tdb?.drop();
});

describe('a published row deleted by someone else before the relay deletes it', () => {
  it('is counted as gone, not as a lost lane, and the relay keeps its lanes', async () => {
    const { app, asA } = await twoTenants(tdb);
    const pause = pausePoint();
    const ids = await asA.transaction().execute((t) =>
      outbox.enqueue(
        t,
        [1, 2, 3].map((n) => ({ topic, key: `k${n}`, payload: { n } })),
      ),
    );
    const relay = createRelayWithTestHooks(
      { db: tdb.db, publisher: createKafkaPublisher({ brokers: kafkaBrokers() }), instanceId: 'r1' },
      {
        afterPublish: async (batch) => {
          if (batch === 1) await pause.hold(); // published, not deleted yet
        },
      },
    );
    const done = relay.run();
    try {
      await pause.reached;
      const lanes = relay.stats().lanesOwned;
      // Someone else deletes the row, published a moment ago (an operator's skip, as the owner).
      const { numAffectedRows } = await sql`DELETE FROM outbox WHERE message_id = ${ids[1]}`.execute(tdb.db);
      expect(numAffectedRows).toBe(1n);
      pause.release();
      await waitFor('the relay to delete the rest', async () => {
        const left = await tdb.db.selectFrom('outbox').select('id').execute();
        return left.length === 0 && relay.stats().goneBeforeDelete > 0;
      });
      expect(relay.stats()).toMatchObject({ published: 3, lostLaneDeletes: 0, goneBeforeDelete: 1 });
      expect(relay.stats().lanesOwned).toBe(lanes);
    } finally {
      pause.release();
      await relay.stop();
      await done;
      await app.destroy();
    }
  });
});
