/**
 * `@cairn-state/cairn/relay`: publishes the outbox to Kafka, in order per key. What this
 * file exports is public; everything else under relay/ is internal. See docs/api.md.
 *
 * @module @cairn-state/cairn/relay
 */
export {
  createKafkaPublisher,
  type KafkaPublisherOptions,
  type Publisher,
  type PublishMessage,
} from '../src/kafka/publisher.js';
export { createRelay } from './relay.js';
export type { Relay, RelayOptions, RelayStats, RelayWalOptions } from './types.js';
