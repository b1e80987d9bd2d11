import { z } from 'zod';
import type { Publisher } from '../src/kafka/publisher.js';
import { objectWith, opt, optionsSchema } from '../src/options.js';
import type { RelayOptions } from './types.js';

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
