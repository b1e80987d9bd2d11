import { sql } from 'kysely';
import type { InboxConsumer } from '../../consumers/inboxConsumer.js';
import { inboxMetrics } from '../../consumers/metrics.js';
import type { Db } from '../../src/db/database.js';
import { databaseUrlFromEnv, kafkaBrokersFromEnv } from '../../src/env.js';
import { exitCodeFor } from '../../src/exitCodes.js';
import type { Logger } from '../../src/logger.js';
import { metricsAddressFromEnv, startMetricsServer } from '../../src/metrics/metricsServer.js';

/** The subscriber's onRestart for demo processes: logs it and counts it in demo_event. */
export function countConsumerRestarts(db: Db, logger: Logger) {
  return (err: Error, attempt: number) => {
    logger.warn({ err: err.message, attempt }, 'kafka consumer crashed; replaced');
    void sql`INSERT INTO demo_event (kind, n) VALUES ('consumer_replaced', 1)`.execute(db).catch(() => {});
  };
}

/** DATABASE_URL and KAFKA_BROKERS, checked: a malformed one exits 78 with a message naming it. */
export function connectionsFromEnv(name: string): { databaseUrl: string; brokers: string[] } {
  try {
    return { databaseUrl: databaseUrlFromEnv(), brokers: kafkaBrokersFromEnv() };
  } catch (err) {
    return exitOn(name, err);
  }
}

function exitOn(name: string, err: unknown): never {
  process.stderr.write(`${name}: ${(err as Error).message}\n`);
  process.exit(exitCodeFor(err));
}

/**
 * Runs the consumer until SIGTERM, then stops it, closes the database and exits 0. While
 * Postgres or the broker does not answer at start, the consumer waits (and says so); with
 * CAIRN_METRICS_PORT set (bound on CAIRN_METRICS_HOST, default 127.0.0.1), /readyz answers 503
 * until it consumes and /metrics shows cairn_inbox_waiting_for. A configuration error (a
 * metrics port already taken too) exits 78 (src/exitCodes.ts).
 */
export async function runUntilSigterm(
  consumer: InboxConsumer,
  o: { name: string; db: Db; groupId: string; topics: string[] },
): Promise<void> {
  let consuming = false;
  let metrics: Awaited<ReturnType<typeof startMetricsServer>> | undefined;
  try {
    const address = metricsAddressFromEnv();
    metrics = address
      ? await startMetricsServer({
          registry: inboxMetrics(consumer, { db: o.db, groupId: o.groupId, topics: o.topics }),
          ...address,
          ready: () => consuming,
        })
      : undefined;
  } catch (err) {
    exitOn(o.name, err);
  }
  process.once('SIGTERM', () => {
    void consumer
      .stop()
      .then(() => metrics?.close())
      .then(() => o.db.destroy())
      .then(() => process.exit(0));
  });
  try {
    await consumer.run();
    consuming = true;
  } catch (err) {
    exitOn(o.name, err);
  }
}
