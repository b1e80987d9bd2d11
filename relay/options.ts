import { z } from 'zod';
import type { KafkaAdmin } from '../src/kafka/admin.js';
import type { Publisher } from '../src/kafka/publisher.js';
import { objectWith, opt, optionsSchema } from '../src/options.js';
import type { RelayOptions } from './types.js';

/**
 * Messages per claim. Measured on the 2-core dev machine (real broker, 40k x 200 B backlog,
 * one run, median of 3, CPU per message Node + Postgres + broker): 1,000 -> 60.6 us,
 * 2,500 -> 38.9, 5,000 -> 41.0. A claim's fixed costs (planning, round trips, one produce
 * request per partition) are paid per batch; past ~2,500 the gain is gone.
 */
export const DEFAULT_BATCH_SIZE = 2500;
/**
 * Payload bytes per claim (1 MiB, the broker's default message.max.bytes): with large messages
 * the batch is cut by bytes before it is by count, so neither the relay's memory nor a produce
 * request grows with the payloads.
 */
export const DEFAULT_MAX_BATCH_BYTES = 1024 * 1024;

/** What createRelay accepts, checked once: an unknown key or a bad value is a ValidationError naming it. */
export const RelayOptionsSchema = optionsSchema<RelayOptions>()(
  z.strictObject({
    db: opt.db(),
    publisher: objectWith<Publisher>(
      'a Publisher (createKafkaPublisher())',
      'connect',
      'publish',
      'disconnect',
    ),
    admin: objectWith<KafkaAdmin>('a KafkaAdmin (createKafkaAdmin())', 'listTopics').optional(),
    logger: opt.logger(),
    instanceId: opt.text().optional(),
    batchSize: opt.count().optional(),
    maxBatchBytes: opt.count().optional(),
    leaseTtlMs: opt.ms().optional(),
    maxIdleMs: opt.ms().optional(),
    vacuumEveryDeletes: z.number().int().nonnegative().optional(),
    wakeOnNotify: opt.text().optional(),
    replicationBarrier: z.enum(['auto', 'off']).optional(),
    publishRetries: z.number().int().nonnegative().optional(),
    wal: z
      .strictObject({
        connectionString: opt.text(),
        slot: opt.text().optional(),
        publication: opt.text().optional(),
        sweepEveryMs: opt.ms().optional(),
      })
      .optional(),
  }),
);
