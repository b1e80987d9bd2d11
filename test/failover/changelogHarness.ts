import { randomBytes } from 'node:crypto';
import type { TenantKeys } from '../../src/crypto/tenantKeys.js';
import type { Db } from '../../src/db/database.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
import { type ReplayChangelogOptions, replayChangelog } from '../../src/recovery/replayChangelog.js';
import type { ChangelogEnvelope, ChangelogOptions } from '../../src/state/changelog.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { createTestTopic, kafkaBrokers } from '../support/testDatabase.js';
import { clock, publishAll, useTwoRegions } from './twoRegions.js';

/**
 * The two regions and helpers of the changelog replay tests (changelog.int, changelogConsumed.int):
 * each file calls it once, with its own label (its databases).
 */
export function changelogHarness(label: string) {
  const dbs = useTwoRegions(label);
  const kafka = kafkaClient(kafkaBrokers(), 'changelog-test');
  /** What the replay reads the broker with (the client CAIRN_KAFKA_CLIENT names). */
  const reader = dbs.reader;
  const ring = { current: 'k1', keys: { k1: randomBytes(32) } };

  /** A pair of stores, region A's and region B's, writing the same changelog topic. */
  async function regions(changelog: Omit<ChangelogOptions, 'topic'> = {}, keys?: [TenantKeys, TenantKeys]) {
    const topic = await createTestTopic('changelog', 2);
    const stage = await createTestTopic('changelog-stage', 2);
    const store = (db: Db, k?: TenantKeys) =>
      createTaskStore({
        db,
        clock,
        // The default cache: a record's previous-state digest then comes from the store's last
        // write, and must equal the digest of the row as region B reads it.
        changelog: { topic, ...changelog },
        ...(k ? { keys: k } : {}),
      });
    return { topic, stage, A: store(dbs.a.db, keys?.[0]), B: store(dbs.b.db, keys?.[1]) };
  }

  async function both(stores: TaskStore[], f: (s: TaskStore) => Promise<unknown>) {
    for (const s of stores) await f(s);
  }

  const publishA = () => publishAll(dbs.a.db, "region A's outbox");

  const replay = (topic: string, extra: Partial<ReplayChangelogOptions> = {}) =>
    replayChangelog(dbs.b.db, reader, {
      topic,
      actor: 'spiffe://acme.example/operator',
      deadlineMs: 30_000,
      ...extra,
    });

  async function docOf(db: Db, taskId: string) {
    return db
      .selectFrom('task_state')
      .select(['version', 'doc'])
      .where('task_id', '=', taskId)
      .executeTakeFirst();
  }

  /** Publishes a hand-made record with the headers the relay would give an outbox row of `tenant`. */
  async function produce(topic: string, e: ChangelogEnvelope, tenant = e.tenant_id, version = e.version) {
    const producer = kafka.producer();
    await producer.connect();
    await producer.send({
      topic,
      messages: [
        {
          key: e.task_id,
          value: JSON.stringify(e),
          headers: {
            'cairn-message-id': `forged-${Math.random()}`,
            'cairn-tenant': tenant,
            'cairn-task-id': e.task_id,
            'cairn-task-version': String(version),
          },
        },
      ],
    });
    await producer.disconnect();
  }

  async function recordsOn(topic: string): Promise<ChangelogEnvelope[]> {
    const { readTopicsToEnd } = await import('../../src/recovery/failover.js');
    return (await readTopicsToEnd(reader, [topic], 30_000, { values: true })).map(
      (m) => JSON.parse(m.value!.toString()) as ChangelogEnvelope,
    );
  }
  return { dbs, kafka, reader, ring, regions, both, publishA, replay, docOf, produce, recordsOn };
}
