import { randomBytes, randomUUID } from 'node:crypto';
import {
  KafkaJSConnectionError,
  KafkaJSLockTimeout,
  KafkaJSNonRetriableError,
  KafkaJSNumberOfRetriesExceeded,
  KafkaJSProtocolError,
} from 'kafkajs';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { checkInvariants, isBrokerOutage } from '../../scripts/chaos/checker.js';
import { verdict } from '../../scripts/demo/verify.js';
import { type Sink, startSink } from '../../scripts/lib/effectSink.js';
import { UnavailableError } from '../../src/errors.js';
import { createKafkaAdmin } from '../../src/kafka/admin.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
import { HEADER } from '../../src/outbox/wire.js';
import { freePort } from '../support/tcpProxy.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

/**
 * The soak's independent checker when the broker does not answer: an outage of a dependency is
 * not a finding, and not a pass either. The topic checks say they could not run (NOT CHECKED,
 * which fails the soak); nothing counts as a violation.
 */
let tdb: TestDatabase;
let sink: Sink;

beforeAll(async () => {
  tdb = await createTestDatabase('chaos_checker');
  await sql`CREATE TABLE chaos_observed (seq bigserial PRIMARY KEY, consumer_group text NOT NULL, key text,
            version int, message_id text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`.execute(
    tdb.db,
  );
  sink = await startSink();
});
afterAll(async () => {
  await sink?.close();
  await tdb?.drop();
});

describe('chaos checker', () => {
  it('a broker that refuses every connection: the topic checks are reported as not run (not as passed), 0 violations', async () => {
    const kafka = createKafkaAdmin({
      brokers: [`127.0.0.1:${await freePort()}`],
      clientId: 'cairn-checker-test',
    });
    const checks = await checkInvariants({
      db: tdb.db,
      kafka,
      sink,
      eventsTopic: 'cairn.checker-test.events',
      observerGroups: ['cairn-checker-test-group'],
      holderAlive: () => true,
      leaseTtlMs: 1000,
      topicDeadlineMs: 2000,
    });
    expect(checks.filter((c) => c.violations > 0)).toEqual([]);
    const topicChecks = checks.filter((c) => c.name.startsWith('topic:'));
    expect(topicChecks.map((c) => c.name)).toEqual([
      'topic: every transition published or still in the outbox',
      'topic: one message id per transition',
      'topic: first copies in per-key order',
    ]);
    for (const c of topicChecks) {
      expect(c.actual).toMatch(/^not checked: the broker did not answer/);
      expect(c.notChecked).toMatch(/^the broker did not answer/);
      expect(verdict(c)).toBe('NOT CHECKED');
    }
  });

  it('only an outage is retried as one: an answer the broker gave (a refusal, a corrupt record) is thrown', () => {
    const refused = new KafkaJSConnectionError('Connection error: connect ECONNREFUSED');
    expect(isBrokerOutage(refused)).toBe(true);
    expect(
      isBrokerOutage(new KafkaJSNumberOfRetriesExceeded(refused, { retryCount: 5, retryTime: 3000 })),
    ).toBe(true);
    expect(isBrokerOutage(new UnavailableError('read did not finish'))).toBe(true);
    const denied = new KafkaJSProtocolError(
      Object.assign(new Error('Not authorized to access topics'), {
        type: 'TOPIC_AUTHORIZATION_FAILED',
        code: 29,
        retriable: false,
      }),
    );
    expect(isBrokerOutage(denied)).toBe(false);
    // kafkajs calls a corrupt record retriable; it is an answer all the same.
    const corrupt = new KafkaJSProtocolError(
      Object.assign(new Error('This message has failed its CRC checksum'), {
        type: 'CORRUPT_MESSAGE',
        code: 2,
        retriable: true,
      }),
    );
    expect(isBrokerOutage(corrupt)).toBe(false);
    // A connection lock waited out on a starved broker: kafkajs itself treats it as unreachable.
    // (kafkajs builds it with a message; its types say it takes none.)
    const LockTimeout = KafkaJSLockTimeout as unknown as new (message: string) => Error;
    expect(isBrokerOutage(new LockTimeout('Timeout while acquiring lock (1 waiting locks)'))).toBe(true);
    expect(isBrokerOutage(new KafkaJSNonRetriableError('Invalid record'))).toBe(false);
    expect(isBrokerOutage(new TypeError("Cannot read properties of undefined (reading 'key')"))).toBe(false);
  });

  it('a transition whose event is neither in the outbox nor on the topic is lost: a violation, never "in flight"', async () => {
    const topic = `cairn.checker-lost-${randomBytes(4).toString('hex')}`;
    const kafka = kafkaClient(inject('kafkaBrokers').split(','), 'cairn-checker-test');
    const admin = kafka.admin();
    await admin.connect();
    await admin.createTopics({ topics: [{ topic, numPartitions: 1 }], waitForLeaders: true });
    await admin.disconnect();
    const producer = kafka.producer();
    await producer.connect();
    await producer.send({
      topic,
      messages: [
        {
          key: 'task-published',
          value: '{}',
          headers: {
            [HEADER.messageId]: randomUUID(),
            [HEADER.taskId]: 'task-published',
            [HEADER.taskVersion]: '1',
          },
        },
      ],
    });
    await producer.disconnect();
    // Rows as the library writes them, without their tasks (the checker reads only these
    // tables): triggers off for this session, which is the test's superuser connection.
    await tdb.db.connection().execute(async (conn) => {
      await sql`SET session_replication_role = replica`.execute(conn);
      for (const taskId of ['task-published', 'task-queued', 'task-lost']) {
        await sql`INSERT INTO task_audit (task_id, version, tenant_id, actor, patch)
                  VALUES (${taskId}, 1, 'demo', 'spiffe://demo.cairn.local/agents/coder', '[]')`.execute(
          conn,
        );
      }
      await sql`INSERT INTO outbox (lane, message_id, tenant_id, task_id, task_version, task_seq, topic, key, headers, payload)
                VALUES (0, ${randomUUID()}, 'demo', 'task-queued', 1, 0, ${topic}, 'task-queued', '{}', '\\x7b7d')`.execute(
        conn,
      );
      await sql`SET session_replication_role = origin`.execute(conn);
    });
    const reader = createKafkaAdmin({
      brokers: inject('kafkaBrokers').split(','),
      clientId: 'cairn-checker-test',
    });
    const checks = await checkInvariants({
      db: tdb.db,
      kafka: reader,
      sink,
      eventsTopic: topic,
      observerGroups: [],
      holderAlive: () => true,
      leaseTtlMs: 1000,
      topicDeadlineMs: 60_000,
    }).finally(() => reader.close());
    const lost = checks.find((c) => c.name === 'topic: every transition published or still in the outbox');
    expect(lost).toMatchObject({ actual: '1 lost', violations: 1 });
    expect(lost?.notChecked).toBeUndefined();
  });
});
