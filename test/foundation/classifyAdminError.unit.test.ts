import { MultipleErrors, NetworkError, ResponseError, UserError } from '@platformatic/kafka';
import { KafkaJSNonRetriableError, KafkaJSProtocolError } from 'kafkajs';
import { describe, expect, it } from 'vitest';
import { isRefusedKafkaError, isRetriableKafkaError } from '../../src/kafka/classifyError.js';

/** A broker answer as @platformatic/kafka reports it: one error per topic or partition. */
const answer = (...codes: number[]) =>
  new ResponseError(
    2,
    1,
    Object.fromEntries(codes.map((c, i) => [`/topics/${i}`, [c, null] as [number, null]])),
    {},
  );
const kafkajs = (type: string, retriable: boolean) =>
  new KafkaJSProtocolError(Object.assign(new Error(type), { type, code: 0, retriable }));

describe('what KafkaAdmin callers ask of an error, on both clients', () => {
  it('retriable: a leader election or a lost connection, on either client', () => {
    expect(isRetriableKafkaError(kafkajs('NOT_LEADER_OR_FOLLOWER', true))).toBe(true);
    expect(isRetriableKafkaError(answer(6))).toBe(true); // NOT_LEADER_OR_FOLLOWER
    expect(
      isRetriableKafkaError(new MultipleErrors('listOffsets failed 3 times.', [answer(5), answer(6)])),
    ).toBe(true);
    expect(isRetriableKafkaError(new NetworkError('Connection closed'))).toBe(true);
  });

  it('not retriable: an answer that will not change, a usage error, anything not a Kafka client error', () => {
    expect(isRetriableKafkaError(kafkajs('TOPIC_AUTHORIZATION_FAILED', false))).toBe(false);
    expect(isRetriableKafkaError(new KafkaJSNonRetriableError('Invalid topic'))).toBe(false);
    expect(isRetriableKafkaError(answer(29))).toBe(false); // TOPIC_AUTHORIZATION_FAILED
    expect(isRetriableKafkaError(answer(6, 29))).toBe(false); // one answer says never
    expect(isRetriableKafkaError(new UserError('Client is closed.'))).toBe(false);
    expect(isRetriableKafkaError(new TypeError('x is undefined'))).toBe(false);
  });

  it('refused for good: a creation the broker will never accept, on either client; an outage is not', () => {
    expect(isRefusedKafkaError(kafkajs('INVALID_REPLICATION_FACTOR', false))).toBe(true);
    expect(isRefusedKafkaError(answer(38))).toBe(true); // INVALID_REPLICATION_FACTOR
    expect(isRefusedKafkaError(kafkajs('REQUEST_TIMED_OUT', true))).toBe(false);
    expect(isRefusedKafkaError(new NetworkError('Connection closed'))).toBe(false);
    expect(isRefusedKafkaError(new Error('socket hang up'))).toBe(false);
  });
});
