import { MultipleErrors, NetworkError, ResponseError, UserError } from '@platformatic/kafka';
import { describe, expect, it } from 'vitest';
import { isPoisonError, isUnknownTopic } from '../../src/kafka/classifyError.js';
import { leadersOf } from '../../src/kafka/platformaticAdmin.js';

// How @platformatic/kafka reports a failed send: the send's error holds the broker response's,
// which holds one error per partition (apiId names the broker's error code).
const failedSend = (code: number) =>
  new MultipleErrors('Producing messages failed.', [
    new ResponseError(0, 9, { '/responses/0/partition_responses/0': [code, null] }, {}),
  ]);

describe('isPoisonError with @platformatic/kafka errors', () => {
  it('parks a message the broker refuses for good (MESSAGE_TOO_LARGE, INVALID_RECORD, TOPIC_AUTHORIZATION_FAILED)', () => {
    for (const code of [10, 87, 29]) expect(isPoisonError(failedSend(code))).toBe(true);
  });
  it('retries what waiting can fix (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS, a lost connection)', () => {
    expect(isPoisonError(failedSend(6))).toBe(false);
    expect(isPoisonError(failedSend(19))).toBe(false);
    expect(
      isPoisonError(new MultipleErrors('metadata failed 4 times.', [new NetworkError('Connection closed')])),
    ).toBe(false);
  });
});

describe('isUnknownTopic with @platformatic/kafka errors', () => {
  it("is the metadata's answer for a topic the cluster does not have (the client's UserError), and nothing else", () => {
    // What a send to a topic colliding with another by '.' and '_' threw (scratch run, 1.4 s after the send).
    expect(isUnknownTopic(new UserError('Unknown topic orders_v1.'))).toBe(true);
    expect(isUnknownTopic(new UserError('Unknown option.'))).toBe(false);
    expect(isUnknownTopic(failedSend(3))).toBe(true);
    expect(isUnknownTopic(failedSend(10))).toBe(false);
  });
});

describe("the platformatic admin's wait for a new topic's leaders", () => {
  it('asks again while the metadata does not know the topic yet (CI: a subscriber created its topic, the next answer said "Unknown topic")', async () => {
    let asked = 0;
    const admin = {
      async metadata() {
        asked++;
        if (asked < 3) throw new UserError('Unknown topic created.t1.');
        return {
          topics: new Map([
            ['created.t1', { partitionsCount: 2, partitions: [{ leader: 1 }, { leader: 1 }] }],
          ]),
        };
      },
    };
    await leadersOf(admin as unknown as Parameters<typeof leadersOf>[0], ['created.t1'], 5_000);
    expect(asked).toBe(3);
  });

  it('still gives up at its deadline, and on any other refusal at once', async () => {
    const unknown = { metadata: async () => Promise.reject(new UserError('Unknown topic never.')) };
    await expect(
      leadersOf(unknown as unknown as Parameters<typeof leadersOf>[0], ['never'], 250),
    ).rejects.toThrow(/Unknown topic never/);
    const refused = { metadata: async () => Promise.reject(new UserError('Unknown option.')) };
    await expect(
      leadersOf(refused as unknown as Parameters<typeof leadersOf>[0], ['t'], 5_000),
    ).rejects.toThrow(/Unknown option/);
  });
});
