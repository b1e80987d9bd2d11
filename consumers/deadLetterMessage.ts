import type { Db } from '../src/db/database.js';
import { messageOf } from '../src/errors.js';
import {
  isPoisonError,
  isRetriableKafkaError,
  isUnknownTopic,
  someInChain,
} from '../src/kafka/classifyError.js';
import type { Publisher } from '../src/kafka/publisher.js';
import type { Logger } from '../src/logger.js';
import { DLQ_HEADER, HEADER } from '../src/outbox/wire.js';
import type { InboxMessage } from './inboxMessage.js';
import { appliedBy } from './sql/insertInboxRows.js';
import { recordDeadLetter } from './sql/recordDeadLetter.js';

/**
 * Whether the error, or one it wraps, is one the client would try again: kafkajs wraps the
 * last retriable error (CORRUPT_MESSAGE, say) in a non-retriable "retries exceeded" one.
 */
const retriableInChain = (err: unknown) => someInChain(err, isRetriableKafkaError);

/** An inbox consumer's dead letters: sent to `<topic>.dlq`, then recorded in `inbox_dlq`. */
export function deadLetterer(o: {
  db: Db;
  groupId: string;
  publisher: Publisher;
  log: Logger;
  onRecorded(): void;
}) {
  let connected: Promise<void> | undefined;
  return {
    async send(m: InboxMessage, error: unknown, attempts: number): Promise<void> {
      const message = messageOf(error);
      // A consumer that lost the partition while this message failed here: its new owner may
      // have applied it meanwhile, and an applied message is never dead-lettered.
      if (await appliedBy(o.db, o.groupId, m)) {
        o.log.warn(
          { message_id: m.messageId },
          'not dead-lettered: another consumer of the group applied it',
        );
        return;
      }
      // A connect that failed (the broker restarting) is tried again by the next dead letter:
      // kept, its rejection failed every dead letter of this process and held its partition.
      connected ??= o.publisher.connect().catch((err: unknown) => {
        connected = undefined;
        throw err;
      });
      await connected;
      // Publish first, then record: a crash in between re-sends the same dead letter (same message id), never loses it.
      let notSent = '';
      await o.publisher
        .publish([
          {
            topic: `${m.topic}.dlq`,
            key: m.key ?? m.messageId,
            value: m.value ?? Buffer.alloc(0),
            headers: {
              ...m.headers,
              [HEADER.messageId]: m.messageId,
              [DLQ_HEADER.error]: message.slice(0, 2000),
              [DLQ_HEADER.consumerGroup]: o.groupId,
              [DLQ_HEADER.originalTopic]: m.topic,
              [DLQ_HEADER.originalPartition]: String(m.partition),
              [DLQ_HEADER.originalOffset]: m.offset,
              [DLQ_HEADER.attempts]: String(attempts),
            },
          },
        ])
        .catch((err: unknown) => {
          // The broker refuses this dead letter for good (larger than the .dlq topic takes, the
          // topic not ours to write): thrown, it failed the batch, and the message ran again at
          // every restart of the consumer, for ever. Recorded without it, the partition moves on;
          // `cairn inbox dlq` lists it and `cairn inbox replay` applies it once it is fixed.
          // Not what the client itself would try again (CORRUPT_MESSAGE is on both lists).
          // A .dlq topic the broker has not and will not create (auto-creation off, or its name
          // colliding with another's by '.' and '_', which any tenant's message may have made):
          // thrown, the message ran again at every fetch, for ever, its partition held (review).
          if (isUnknownTopic(err)) {
            notSent = ` (not sent to ${m.topic}.dlq, a topic the broker does not have: ${messageOf(err)})`;
            return;
          }
          if (!isPoisonError(err) || retriableInChain(err)) throw err;
          notSent = ` (not sent to ${m.topic}.dlq, which the broker refuses: ${messageOf(err)})`;
        });
      // Here inbox_dlq is the only copy of the error: kept whole.
      const recordedError = `${message}${notSent.slice(0, 1000)}`;
      const recorded = await o.db
        .transaction()
        .execute((trx) =>
          recordDeadLetter(trx, { groupId: o.groupId, message: m, error: recordedError, attempts }),
        );
      if (!recorded) {
        o.log.warn(
          { message_id: m.messageId },
          'dead letter not recorded: another consumer of the group applied it',
        );
        return;
      }
      o.onRecorded();
      o.log.error(
        { message_id: m.messageId, topic: m.topic, offset: m.offset, err: recordedError },
        notSent ? 'message dead-lettered (in inbox_dlq only)' : 'message dead-lettered',
      );
    },
    async disconnect(): Promise<void> {
      if (connected) await o.publisher.disconnect().catch(() => {});
    },
  };
}
