import {
  KafkaJSConnectionError,
  KafkaJSNonRetriableError,
  KafkaJSNumberOfRetriesExceeded,
  KafkaJSProtocolError,
} from 'kafkajs';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkInvariants, isBrokerOutage } from '../../scripts/chaos/checker.js';
import { verdict } from '../../scripts/demo/verify.js';
import { type Sink, startSink } from '../../scripts/lib/effectSink.js';
import { UnavailableError } from '../../src/errors.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
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
    const kafka = kafkaClient([`127.0.0.1:${await freePort()}`], 'cairn-checker-test');
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
    expect(isBrokerOutage(new KafkaJSNonRetriableError('Invalid record'))).toBe(false);
    expect(isBrokerOutage(new TypeError("Cannot read properties of undefined (reading 'key')"))).toBe(false);
  });
});
