import { describe, expect, it } from 'vitest';
import { dependencyWait, dependencyWaiter, nextStep } from '../../consumers/dependencyWait.js';
import { UnavailableError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';

const bound = { boundMs: 1000, refused: false };

describe("a batch's wait for a dependency past its bound is the message's only when the dependency is evidently there", () => {
  it('waits within the bound, whatever the others do, for a dependency that does not answer', () => {
    const w = dependencyWait();
    expect(nextStep(w, { at: 0, applied: 5 }, bound)).toBe('wait');
    w.tries = 3;
    expect(nextStep(w, { at: 1000, applied: 50 }, bound)).toBe('wait');
  });

  it("within the bound, a refusal while others are applied is the message's at once", () => {
    const w = dependencyWait();
    const refused = { boundMs: 1000, refused: true };
    expect(nextStep(w, { at: 0, applied: 5 }, refused)).toBe('wait');
    w.tries = 1;
    expect(nextStep(w, { at: 100, applied: 5 }, refused)).toBe('wait');
    expect(nextStep(w, { at: 200, applied: 6 }, refused)).toBe('message');
  });

  it('past the bound: an outage while nothing was applied anywhere and nothing answered', () => {
    const w = dependencyWait();
    nextStep(w, { at: 0, applied: 5 }, bound);
    w.tries = 1;
    expect(nextStep(w, { at: 5000, applied: 5 }, bound)).toBe('outage');
    expect(nextStep(w, { at: 5000, applied: 6 }, bound)).toBe('message');
    expect(nextStep(w, { at: 5000, applied: 5 }, { boundMs: 1000, refused: true })).toBe('message');
  });

  it('a batch commit starts the next wait afresh; a message given up moves only the evidence', () => {
    let applied = 5;
    const waiter = dependencyWaiter({
      log: silentLogger,
      signal: new AbortController().signal,
      maxAttempts: 1,
      retryBaseMs: 1,
      retryMaxMs: 250,
      applied: () => applied,
    });
    const w = dependencyWait();
    nextStep(w, { at: 0, applied }, bound);
    w.tries = 1;
    applied = 9; // applied elsewhere: the first message past the bound is given up
    expect(nextStep(w, { at: 5000, applied }, bound)).toBe('message');
    waiter.gaveUp(w, new Error('a handler of its own'));
    // The next one is past the bound at once, but needs new evidence: none came, an outage.
    expect(nextStep(w, { at: 5100, applied }, bound)).toBe('outage');
    waiter.committed(w);
    expect(nextStep(w, { at: 9000, applied }, bound)).toBe('wait');
  });

  it("says it waits while a batch does, and no more once the batch's message committed", async () => {
    const waiter = dependencyWaiter({
      log: silentLogger,
      signal: new AbortController().signal,
      maxAttempts: 1,
      retryBaseMs: 1,
      retryMaxMs: 250,
      applied: () => 0,
    });
    const w = dependencyWait();
    const waited = waiter.back(new Error('down'), w, { refused: false, beat: () => {} });
    expect(waiter.waiting()).toBe(true);
    expect(await waited).toBe('waited');
    expect(waiter.waiting()).toBe(true);
    waiter.committed(w);
    expect(waiter.waiting()).toBe(false);
  });

  it("goes by the key provider's own answers, not by messages applied that never called it", async () => {
    let applied = 0;
    let answered = 0;
    const waiter = dependencyWaiter({
      log: silentLogger,
      signal: new AbortController().signal,
      maxAttempts: 1,
      retryBaseMs: 1,
      retryMaxMs: 5, // bound: 20 ms
      applied: () => applied,
    });
    const down = new UnavailableError('the key provider did not answer', undefined, {
      answers: () => answered,
    });
    const w = dependencyWait();
    const beat = { refused: false, beat: () => {} };
    // The provider is down; messages that need no key keep being applied (a tenant can send them).
    const until = performance.now() + 80;
    while (performance.now() < until) {
      applied += 10;
      expect(await waiter.back(down, w, beat)).toBe('waited');
    }
    // Once it answers others, a message it still fails past the bound is the message's.
    answered++;
    expect(await waiter.back(down, w, beat)).toBe('none');
  });

  it('a refusal of a data key given up once is given up at once in a later batch; another key is waited for', async () => {
    const waiter = dependencyWaiter({
      log: silentLogger,
      signal: new AbortController().signal,
      maxAttempts: 1,
      retryBaseMs: 1,
      retryMaxMs: 1000, // bound: 4 s
      applied: () => 0,
    });
    const refused = (subject: string) =>
      new UnavailableError('the key provider refused', undefined, { refused: true, subject });
    const first = dependencyWait();
    first.tries = 1;
    first.since = performance.now() - 5000; // past the bound
    expect(await waiter.back(refused('acme/dk-1'), first, { refused: true, beat: () => {} })).toBe('none');
    waiter.gaveUp(first, refused('acme/dk-1'));
    const later = dependencyWait(); // another batch
    expect(await waiter.back(refused('acme/dk-1'), later, { refused: true, beat: () => {} })).toBe('none');
    // Another tenant's refusal in the very batch where acme's was given up is waited for: one
    // tenant's disabled key says nothing of another's (a review found a per-batch flag did).
    waiter.committed(first); // a message applied between them
    expect(await waiter.back(refused('globex/dk-9'), first, { refused: true, beat: () => {} })).toBe(
      'waited',
    );
    expect(
      await waiter.back(refused('globex/dk-2'), dependencyWait(), { refused: true, beat: () => {} }),
    ).toBe('waited');
  });

  it("a server that answered (read-only for a handler, writable at the ping) is waited for the whole bound, others applied or not, then the message's", () => {
    const w = dependencyWait();
    const answered = { boundMs: 1000, refused: false, answered: true };
    expect(nextStep(w, { at: 0, applied: 5 }, answered)).toBe('wait');
    w.tries = 1;
    expect(nextStep(w, { at: 500, applied: 50 }, answered)).toBe('wait');
    expect(nextStep(w, { at: 1500, applied: 50 }, answered)).toBe('message');
  });
});
