import { describe, expect, it } from 'vitest';
import { lagMirror } from '../../scripts/failover/perRegion.js';
import { isTransientCheckError, waitUntil } from '../../scripts/failover/waitUntil.js';

const pgError = (code: string, message = `sqlstate ${code}`) => Object.assign(new Error(message), { code });

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

describe('which failed checks the failover scenario asks again', () => {
  it('an outage or a shortage, yes; a mistake or a refusal of the statement, no', () => {
    const cases: Array<[unknown, boolean]> = [
      [pgError('57P01', 'terminating connection due to administrator command'), true],
      [pgError('57P03', 'the database system is starting up'), true],
      [pgError('25006', 'cannot execute INSERT in a read-only transaction'), true],
      [pgError('53300', 'sorry, too many clients already'), true],
      [pgError('53100', 'could not resize shared memory segment'), true],
      [pgError('53200', 'out of memory'), true],
      [pgError('08006'), true],
      [pgError('ECONNREFUSED', 'connect ECONNREFUSED 127.0.0.1:5999'), true],
      [pgError('EADDRNOTAVAIL', 'connect EADDRNOTAVAIL 127.0.0.1'), true],
      [new Error('timeout expired'), true],
      [new Error('Connection terminated due to connection timeout'), true],
      [new Error('Connection terminated unexpectedly'), true],
      [pgError('42P01', 'relation "tasks_typo" does not exist'), false],
      [pgError('42703', 'column "sttus" does not exist'), false],
      [pgError('22P02', 'invalid input syntax for type uuid'), false],
      [new TypeError("Cannot read properties of undefined (reading 'n')"), false],
    ];
    for (const [err, transient] of cases)
      expect({ err: (err as Error).message, transient: isTransientCheckError(err) }).toEqual({
        err: (err as Error).message,
        transient,
      });
  });
});

describe("the per-region scenario's paused mirror", () => {
  const regionB = { pauseMirror: () => {} } as unknown as Parameters<typeof lagMirror>[0];
  const quick: Parameters<typeof lagMirror>[2] = (what, check) => waitUntil(what, check, 100);

  it('logs a region A that made no progress by the deadline, and goes on', async () => {
    const lines: string[] = [];
    await lagMirror(
      regionB,
      async () => 7,
      quick,
      (l) => lines.push(l),
    );
    expect(lines).toEqual(['[failover] region A made no progress while the mirror was paused']);
  });

  it('does not take a check that failed for no progress (review: the failure was logged as one)', async () => {
    const lines: string[] = [];
    let asked = 0;
    const progress = async () => {
      if (asked++ > 0) throw pgError('42P01', 'relation "task_state_typo" does not exist');
      return 1;
    };
    await expect(lagMirror(regionB, progress, quick, (l) => lines.push(l))).rejects.toThrow(
      /a check failed: relation "task_state_typo" does not exist/,
    );
    expect(lines).toEqual([]);
  });
});
