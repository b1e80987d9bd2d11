/**
 * `@cairn-state/cairn/inbox`: inbox consumers that apply each message once, in the
 * handler's transaction, and their dead letters. What this file exports is public;
 * everything else under consumers/ is internal. See docs/api.md.
 *
 * @module @cairn-state/cairn/inbox
 */
export {
  type CreateTopicsOptions,
  createKafkaSubscriber,
  type KafkaSubscriberOptions,
  type ReceivedBatch,
  type ReceivedMessage,
  type Subscriber,
} from '../src/kafka/subscriber.js';
export { type DeadLetter, listDeadLetters, replayDeadLetter } from './deadLetters.js';
export { HandlerTimeoutError } from './handlerDeadline.js';
export {
  type AppTables,
  createInboxConsumer,
  type InboxCommitCounts,
  type InboxConsumer,
  type InboxConsumerOptions,
  type InboxHandler,
  type InboxMessage,
  type InboxStats,
  type NoCairnNames,
  type NoTables,
} from './inboxConsumer.js';
