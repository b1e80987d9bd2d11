import { describe, expect, it } from 'vitest';
import { UnavailableError } from '../../src/errors.js';
import { ExitCode, exitCodeFor } from '../../src/exitCodes.js';
import type { KafkaAdmin } from '../../src/kafka/admin.js';
import { endOffsets, groupOffsets } from '../../src/recovery/readTopics.js';

// A fresh-clone CI run (2026-12-03) failed `cairn failover check`'s test on kafkajs's "This is
// not the correct coordinator for this group" (NOT_COORDINATOR, retriable): the group's
// coordinator had moved or was loading. An answer of a moment, asked again until the deadline;
// a refusal for good is thrown at once.
const refusal = (retriable: boolean) =>
  Object.assign(
    new Error(retriable ? 'This is not the correct coordinator for this group' : 'Not authorized'),
    {
      name: 'KafkaJSProtocolError',
      type: retriable ? 'NOT_COORDINATOR' : 'GROUP_AUTHORIZATION_FAILED',
      retriable,
    },
  );

/** An admin whose committedOffsets fails `failures` times with `err` first (only that method is asked). */
function adminFailing(failures: number, err: Error) {
  let calls = 0;
  const admin = {
    async committedOffsets(_groupId: string, topics: readonly string[]) {
      calls++;
      if (calls <= failures) throw err;
      return topics.map((topic) => ({ topic, partitions: [{ partition: 0, offset: '7' }] }));
    },
  } as unknown as KafkaAdmin;
  return { admin, calls: () => calls };
}

describe("the failover check's read of committed offsets", () => {
  it('asks again after a retriable answer (a coordinator moving)', async () => {
    const a = adminFailing(2, refusal(true));
    const got = await groupOffsets(a.admin, [{ groupId: 'g', topics: ['t'] }]);
    expect(a.calls()).toBe(3);
    expect(got.get('g')).toEqual([{ topic: 't', partitions: [{ partition: 0, offset: '7' }] }]);
  });

  it('throws a refusal for good at once', async () => {
    const a = adminFailing(1, refusal(false));
    await expect(groupOffsets(a.admin, [{ groupId: 'g', topics: ['t'] }])).rejects.toThrow(/Not authorized/);
    expect(a.calls()).toBe(1);
  });

  it('gives up at its deadline with an outage (exit 75), not a failure', async () => {
    const a = adminFailing(Number.POSITIVE_INFINITY, refusal(true));
    const err = await groupOffsets(a.admin, [{ groupId: 'g', topics: ['t'] }], 500).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UnavailableError);
    expect(err).toMatchObject({
      code: 'unavailable',
      message: expect.stringMatching(/group g.*coordinator/),
    });
    expect(exitCodeFor(err)).toBe(ExitCode.unavailable);
  });

  // Review: the deadline was per group, so each group read late had a whole deadline again;
  // a read past it still has a tenth of it (review: a moment's answer at the end of a long
  // check ended it).
  it('has one deadline for all the groups it reads, and a tenth of it for a read past it', async () => {
    const nextAsked: number[] = [];
    const admin = {
      async committedOffsets(groupId: string, topics: readonly string[]) {
        if (groupId === 'slow')
          await new Promise((r) => setTimeout(r, 1100)); // past the deadline
        else {
          nextAsked.push(performance.now());
          throw refusal(true);
        }
        return topics.map((topic) => ({ topic, partitions: [{ partition: 0, offset: '7' }] }));
      },
    } as unknown as KafkaAdmin;
    const groups = [
      { groupId: 'slow', topics: ['t'] },
      { groupId: 'next', topics: ['t'] },
    ];
    await expect(groupOffsets(admin, groups, 1000)).rejects.toThrow(UnavailableError);
    // Asked for about 100 ms (a deadline of its own: asked at 0, 200, 600 and 1,000 ms).
    expect(nextAsked.length).toBeGreaterThanOrEqual(2); // asked again within its tenth
    expect(nextAsked.at(-1)! - nextAsked[0]!).toBeLessThan(500);
  });

  // Review: kafkajs's own retries (finding the group's coordinator) end in
  // KafkaJSNumberOfRetriesExceeded, not retriable itself, around a refused connection: exit 1.
  it("takes a client's exhausted retries around a broker not reached for an outage", async () => {
    const exhausted = Object.assign(new Error('retries exceeded'), {
      name: 'KafkaJSNumberOfRetriesExceeded',
      retriable: false,
      cause: Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:9092'), {
        name: 'KafkaJSConnectionError',
        code: 'ECONNREFUSED',
        retriable: true,
      }),
    });
    const a = adminFailing(Number.POSITIVE_INFINITY, exhausted);
    const err = await groupOffsets(a.admin, [{ groupId: 'g', topics: ['t'] }], 300).catch((e: unknown) => e);
    expect(exitCodeFor(err)).toBe(ExitCode.unavailable);
    expect(a.calls()).toBeGreaterThan(1);
  });
});

describe("the failover check's read of end offsets", () => {
  it('gives up at its deadline with an outage (exit 75)', async () => {
    const admin = {
      async topicOffsets() {
        throw refusal(true);
      },
    } as unknown as KafkaAdmin;
    const err = await endOffsets(admin, ['t1', 't2'], 400).catch((e: unknown) => e);
    expect(exitCodeFor(err)).toBe(ExitCode.unavailable);
    expect((err as Error).message).toMatch(/topic t1's offsets/);
  });
});
