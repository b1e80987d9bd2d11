import { ConfigurationError } from '../errors.js';

/**
 * The Kafka clients behind Publisher and Subscriber. `confluent` is
 * @confluentinc/kafka-javascript, an optional peer dependency the application installs.
 */
export const kafkaClientNames = ['kafkajs', 'platformatic', 'confluent'] as const;
export type KafkaClientName = (typeof kafkaClientNames)[number];

/**
 * The client a factory uses when its options name none: CAIRN_KAFKA_CLIENT, else kafkajs.
 * Read at each factory call, so the relay and inbox mains, the tests and the benches all
 * switch with one variable and nothing else changes.
 */
export function defaultKafkaClient(env: NodeJS.ProcessEnv = process.env): KafkaClientName {
  const name = env.CAIRN_KAFKA_CLIENT;
  if (name === undefined || name === '') return 'kafkajs';
  if ((kafkaClientNames as readonly string[]).includes(name)) return name as KafkaClientName;
  throw new ConfigurationError(
    `CAIRN_KAFKA_CLIENT is "${name}", which is not a Kafka client Cairn has: use one of ${kafkaClientNames.join(', ')}, or unset it for kafkajs`,
  );
}
