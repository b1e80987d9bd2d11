import { z } from 'zod';
import type { Publisher } from '../src/kafka/publisher.js';
import type { Subscriber } from '../src/kafka/subscriber.js';
import { objectWith, opt, optionsSchema } from '../src/options.js';
import type { InboxCommitCounts, InboxConsumerOptions, InboxHandler } from './inboxConsumer.js';

/** What createInboxConsumer accepts, checked once: an unknown key or a bad value is a ValidationError naming it. */
export const InboxConsumerOptionsSchema = optionsSchema<InboxConsumerOptions>()(
  z.strictObject({
    db: opt.db(),
    subscriber: objectWith<Subscriber>('a Subscriber (createKafkaSubscriber())', 'run', 'commit', 'stop'),
    dlqPublisher: objectWith<Publisher>(
      'a Publisher (createKafkaPublisher())',
      'connect',
      'publish',
      'disconnect',
    ),
    groupId: opt.text(),
    handler: opt.fn<InboxHandler>('an async function (trx, message) => void'),
    logger: opt.logger(),
    chunkSize: opt.count().optional(),
    maxAttempts: opt.count().optional(),
    retryBaseMs: opt.ms().optional(),
    retryMaxMs: opt.ms().optional(),
    handlerTimeoutMs: opt.ms().optional(),
    refuseStaleVersions: z.boolean().optional(),
    retentionMs: opt.ms().optional(),
    pruneEveryMs: opt.ms().optional(),
    onCommitted: opt.fn<(counts: InboxCommitCounts) => void>().optional(),
  }),
);
