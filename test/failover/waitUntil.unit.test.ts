import { describe, expect, it } from 'vitest';
import { waitUntil } from '../../scripts/failover/waitUntil.js';

describe("the failover scenario's waitUntil", () => {
  it('asks again after a check that throws (a connection slow to open), until it holds', async () => {
    let asked = 0;
    await waitUntil(
      'the third answer',
      async () => {
        asked++;
        if (asked < 3) throw new Error('timeout expired');
        return true;
      },
      10_000,
    );
    expect(asked).toBe(3);
  });

  it("names the last check's error at the deadline", async () => {
    await expect(
      waitUntil(
        'a server that never answers',
        async () => {
          throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5999'), { code: 'ECONNREFUSED' });
        },
        100,
      ),
    ).rejects.toThrow(
      /timed out after 100 ms waiting for a server that never answers \(the last check failed: connect ECONNREFUSED 127.0.0.1:5999\)/,
    );
  });

  it('says only what it waited for when every check answered no', async () => {
    await expect(waitUntil('nothing', async () => false, 100)).rejects.toThrow(
      /^failover: timed out after 100 ms waiting for nothing$/,
    );
  });

  it('does not wait past its deadline for a check that never answers', async () => {
    const started = Date.now();
    await expect(waitUntil('a query that hangs', () => new Promise<boolean>(() => {}), 100)).rejects.toThrow(
      /waiting for a query that hangs \(the last check failed: a check was still running\)/,
    );
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it('names no old error once a later check answered no', async () => {
    let asked = 0;
    await expect(
      waitUntil(
        'a no after an error',
        async () => {
          if (asked++ === 0) throw new Error('timeout expired');
          return false;
        },
        200,
      ),
    ).rejects.toThrow(/^failover: timed out after 200 ms waiting for a no after an error$/);
  });

  it('asks again while the server is starting up (57P03), and fails at once on a mistake in the check (42P01), naming it', async () => {
    let asked = 0;
    await waitUntil(
      'a server starting up',
      async () => {
        if (asked++ < 2)
          throw Object.assign(new Error('the database system is starting up'), { code: '57P03' });
        return true;
      },
      10_000,
    );
    expect(asked).toBe(3);
    const started = Date.now();
    asked = 0;
    await expect(
      waitUntil(
        'a table that is not there',
        async () => {
          asked++;
          throw Object.assign(new Error('relation "tasks_typo" does not exist'), { code: '42P01' });
        },
        60_000,
      ),
    ).rejects.toThrow(
      /^failover: waiting for a table that is not there, a check failed: relation "tasks_typo" does not exist$/,
    );
    expect(asked).toBe(1);
    expect(Date.now() - started).toBeLessThan(5_000);
  });
});
