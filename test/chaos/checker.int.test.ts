import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkInvariants } from '../../scripts/chaos/checker.js';
import { type Sink, startSink } from '../../scripts/lib/effectSink.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
import { freePort } from '../support/tcpProxy.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

/**
 * The soak's independent checker when the broker does not answer: an outage of a dependency is
 * not a finding. The topic checks say they could not run; nothing counts as a violation.
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
  it('a broker that refuses every connection: the topic checks are reported as not run, 0 violations', async () => {
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
    for (const c of topicChecks) expect(c.actual).toMatch(/^not checked: the broker did not answer/);
  });
});
