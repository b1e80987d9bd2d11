import { createInboxConsumer } from '../../consumers/inboxConsumer.js';
import type { Db } from '../../src/db/database.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../../src/kafka/subscriber.js';
import type { TaskStore } from '../../src/state/taskStore.js';
import { AGENT, planApproved } from '../state/fixtures.js';
import { kafkaBrokers } from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

/**
 * Region A's agent on `topic`: each message moves the task its key names from version 1 on
 * (plan approved), in the inbox transaction (so the changelog record names the message it
 * consumed). Runs until `applied` messages went through, then stops.
 */
export async function runRegionAAgent(o: { db: Db; store: TaskStore; topic: string; applied: number }) {
  const group = `region-a-agent-${Date.now()}`;
  const consumer = createInboxConsumer({
    db: o.db,
    groupId: group,
    subscriber: createKafkaSubscriber({ brokers: kafkaBrokers(), groupId: group, topics: [o.topic] }),
    dlqPublisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
    handler: async (trx, m) => {
      const u = await o.store.update({
        taskId: m.key!,
        expectedVersion: 1,
        patch: planApproved(),
        actor: AGENT,
        trx,
      });
      if (!u.ok) throw u.error;
    },
  });
  const consuming = consumer.run();
  try {
    await waitFor(
      `the agent in region A to apply ${o.applied} message(s)`,
      async () => consumer.stats().applied === o.applied,
    );
  } finally {
    await consumer.stop();
    await consuming;
  }
  return group;
}
