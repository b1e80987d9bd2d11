import { describe, expect, it } from 'vitest';
import { stepAsidePolicy } from '../../relay/stepAside.js';

/** What kafkajs throws once its retries to an unreachable broker are spent. */
const unreachable = () =>
  Object.assign(new Error('KafkaJSNumberOfRetriesExceeded'), {
    cause: Object.assign(new Error('Connection error: connect ECONNREFUSED 127.0.0.1:9092'), {
      name: 'KafkaJSConnectionError',
    }),
  });
/** A broker's answer about a topic: another relay would meet it too. */
const unknownTopic = () =>
  Object.assign(new Error('This server does not host this topic-partition'), {
    type: 'UNKNOWN_TOPIC_OR_PARTITION',
    retriable: true,
  });

describe('when a relay that cannot reach the broker steps aside', () => {
  it('after twice the TTL of unreachable-broker failures; away twice as long each time; a good step resets it', () => {
    let t = 0;
    const p = stepAsidePolicy(1000, () => t);
    expect(p.failed(unreachable())).toBe(false); // the first failure starts the clock
    t = 1999;
    expect(p.failed(unreachable())).toBe(false);
    t = 2000;
    expect(p.failed(unreachable())).toBe(true);
    expect(p.stepped()).toBe(2000);
    expect(p.asideForMs).toBe(2000);
    t = 4000;
    expect(p.asideForMs).toBe(0);
    expect(p.failed(unreachable())).toBe(false); // back: the clock starts again
    t = 6000;
    expect(p.failed(unreachable())).toBe(true);
    expect(p.stepped()).toBe(4000);
    for (let i = 0; i < 10; i++) p.stepped();
    expect(p.stepped()).toBe(64_000); // capped
    p.sent();
    t = 100_000;
    expect(p.failed(unreachable())).toBe(false);
    t = 102_000;
    expect(p.failed(unreachable())).toBe(true);
    expect(p.stepped()).toBe(2000);
  });

  it('a failure, then steps without one (idle) for an hour, then a failure: the clock starts again', () => {
    let t = 0;
    const p = stepAsidePolicy(1000, () => t);
    expect(p.failed(unreachable())).toBe(false);
    t = 3_600_000;
    p.idle(); // a step with nothing to send, long after
    t = 3_600_001;
    expect(p.failed(unreachable())).toBe(false);
  });

  it('steps that send nothing (no lanes yet, or the sweep of an empty table) do not reset the backoff, nor the clock right after a failure (review)', () => {
    let t = 0;
    const p = stepAsidePolicy(1000, () => t);
    p.failed(unreachable());
    t = 2000;
    expect(p.failed(unreachable())).toBe(true);
    expect(p.stepped()).toBe(2000);
    t = 4000; // back, with no lanes at first: steps with nothing to send
    p.idle();
    t = 4500;
    p.idle();
    expect(p.failed(unreachable())).toBe(false); // lanes again, still cut off
    t = 4600;
    p.idle(); // a step between two failures that sent nothing (WAL mode: the table's sweep found no row)
    t = 6500;
    expect(p.failed(unreachable())).toBe(true);
    expect(p.stepped()).toBe(4000); // away twice as long
    t = 10_000;
    p.sent();
    p.failed(unreachable());
    t = 12_000;
    expect(p.failed(unreachable())).toBe(true);
    expect(p.stepped()).toBe(2000); // a batch sent reset it
  });

  it('a broker answer about a message or topic never makes it step aside, and stops the clock', () => {
    let t = 0;
    const p = stepAsidePolicy(1000, () => t);
    for (; t <= 10_000; t += 500) expect(p.failed(unknownTopic())).toBe(false);
    expect(p.failed(unreachable())).toBe(false);
    t += 1000;
    expect(p.failed(unknownTopic())).toBe(false);
    t += 1500;
    expect(p.failed(unreachable())).toBe(false); // the clock started again at the last unreachable one
  });
});
