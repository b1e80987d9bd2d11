import { sql } from 'kysely';
import type { InboxConsumer } from '../../consumers/inboxConsumer.js';
import type { Db } from '../../src/db/database.js';
import type { Logger } from '../../src/logger.js';

/** The subscriber's onRestart for demo processes: logs it and counts it in demo_event. */
export function countConsumerRestarts(db: Db, logger: Logger) {
  return (err: Error, attempt: number) => {
    logger.warn({ err: err.message, attempt }, 'kafka consumer crashed; replaced');
    void sql`INSERT INTO demo_event (kind, n) VALUES ('consumer_replaced', 1)`.execute(db).catch(() => {});
  };
}

/** Runs the consumer until SIGTERM, then stops it, closes the database and exits 0. */
export async function runUntilSigterm(consumer: InboxConsumer, db: Db): Promise<void> {
  process.once('SIGTERM', () => {
    void consumer
      .stop()
      .then(() => db.destroy())
      .then(() => process.exit(0));
  });
  await consumer.run();
}
