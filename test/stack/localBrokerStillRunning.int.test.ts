import { describe, expect, inject, it } from 'vitest';
import { localBrokerStillRunning, readPid } from '../../cli/stack/kafka.js';

describe('the line a run ends with about the local broker', () => {
  it('names the running local broker, its pid and `npm run stack:down`; says whether this run started it', (ctx) => {
    if (!inject('kafkaLocal')) ctx.skip(); // only where the tests run on the local stack's broker
    const brokers = inject('kafkaBrokers');
    const pid = readPid();
    expect(localBrokerStillRunning(brokers, { startedByThisRun: false })).toBe(
      `the local stack's Kafka broker on ${brokers} (pid ${pid}) is still running. Stop it with \`npm run stack:down\``,
    );
    expect(localBrokerStillRunning(brokers, { startedByThisRun: true })).toBe(
      `this run started the Kafka broker on ${brokers} (pid ${pid}); it is still running, ready for the next run. ` +
        'Stop it with `npm run stack:down`',
    );
  });

  it('says nothing when the run used another broker', () => {
    expect(localBrokerStillRunning('127.0.0.1:1', { startedByThisRun: false })).toBeUndefined();
    expect(
      localBrokerStillRunning('kafka-1.example:9092,kafka-2.example:9092', { startedByThisRun: true }),
    ).toBe(undefined);
  });
});
