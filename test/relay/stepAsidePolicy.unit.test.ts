import { describe, expect, it } from 'vitest';
import { stepAsidePolicy } from '../../relay/stepAside.js';

describe('when a relay that cannot publish steps aside', () => {
  it('after twice the TTL of failures with another relay live; away twice as long each time; a success resets it', async () => {
    let t = 0;
    const p = stepAsidePolicy(1000, () => t);
    const one = async () => 1;
    expect(await p.failed(one)).toBe(false); // the first failure starts the clock
    t = 1999;
    expect(await p.failed(one)).toBe(false);
    t = 2000;
    expect(await p.failed(async () => 0)).toBe(false); // alone: stepping aside helps nobody
    expect(await p.failed(async () => Promise.reject(new Error('postgres down')))).toBe(false);
    expect(await p.failed(one)).toBe(true);
    expect(p.stepped()).toBe(2000);
    expect(p.asideForMs).toBe(2000);
    t = 4000;
    expect(p.asideForMs).toBe(0);
    expect(await p.failed(one)).toBe(false); // back: the clock starts again
    t = 6000;
    expect(await p.failed(one)).toBe(true);
    expect(p.stepped()).toBe(4000);
    for (let i = 0; i < 10; i++) p.stepped();
    expect(p.stepped()).toBe(64_000); // capped
    p.published();
    t = 100_000;
    expect(await p.failed(one)).toBe(false);
    t = 102_000;
    expect(await p.failed(one)).toBe(true);
    expect(p.stepped()).toBe(2000);
  });
});
