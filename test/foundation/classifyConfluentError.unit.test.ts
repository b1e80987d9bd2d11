import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import { ConfigurationError } from '../../src/errors.js';
import { isKafkaConfigurationError, isPoisonError } from '../../src/kafka/classifyError.js';
import { loadConfluent } from '../../src/kafka/confluentModule.js';
import { confluentForTests } from '../support/confluent.js';

const installed = await confluentForTests('classifyConfluentError.unit.test.ts');

describe('the confluent client without its module', () => {
  it('is a ConfigurationError that says how to install it', async () => {
    const err = await loadConfluent('@confluentinc/kafka-javascript-not-here').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConfigurationError);
    expect((err as Error).message).toMatch(/npm install @confluentinc\/kafka-javascript@1/);
    expect((err as ConfigurationError).retriable).toBe(false);
  });
});

describe.skipIf(!installed)(
  `isPoisonError with @confluentinc/kafka-javascript errors${installed ? '' : ' (skipped: the module is not installed)'}`,
  () => {
    // librdkafka's errors as its bindings hand them over (a delivery report's, produce()'s).
    const LibrdKafkaError = installed
      ? (createRequire(import.meta.url)('@confluentinc/kafka-javascript/lib/error') as new (e: {
          message: string;
          code: number;
        }) => Error)
      : (Error as unknown as new (e: {
          message: string;
          code: number;
        }) => Error);
    const rdError = (code: number) => new LibrdKafkaError({ message: `Broker: code ${code}`, code });

    it('parks a message the broker refuses for good (MSG_SIZE_TOO_LARGE, INVALID_RECORD, TOPIC_AUTHORIZATION_FAILED)', () => {
      for (const code of [10, 87, 29]) expect(isPoisonError(rdError(code))).toBe(true);
    });
    it('retries what waiting can fix (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS, a message timed out, all brokers down)', () => {
      for (const code of [6, 19, -192, -187]) expect(isPoisonError(rdError(code))).toBe(false);
    });
    it('says a refused login or setting is configuration, an outage is not', () => {
      expect(isKafkaConfigurationError(rdError(-169))).toBe(true);
      expect(isKafkaConfigurationError(rdError(58))).toBe(true);
      expect(isKafkaConfigurationError(rdError(-195))).toBe(false); // transport
    });
  },
);
