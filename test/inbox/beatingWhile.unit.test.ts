import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { beatingWhile } from '../../consumers/heartbeat.js';

// Review: a handler abandoned at its deadline that never returns kept its 500 ms heartbeat
// going for good (one timer per attempt, heartbeating a batch long finished, keeping the process up).
describe('beatingWhile', () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  const heartbeat = () => {
    let beats = 0;
    return { beat: () => void beats++, failed: () => false, beats: () => beats };
  };

  it('beats every 500 ms while the call runs, and stops when it returns', async () => {
    const h = heartbeat();
    let finish: () => void = () => {};
    const running = beatingWhile(h, () => new Promise<void>((r) => (finish = r)));
    await vi.advanceTimersByTimeAsync(1600);
    expect(h.beats()).toBe(3);
    finish();
    await running;
    await vi.advanceTimersByTimeAsync(2000);
    expect(h.beats()).toBe(3);
  });

  it('stops beating when the call is abandoned, though it never returns', async () => {
    const h = heartbeat();
    const abandoned = new AbortController();
    void beatingWhile(h, () => new Promise<void>(() => {}), abandoned.signal);
    await vi.advanceTimersByTimeAsync(1100);
    expect(h.beats()).toBe(2);
    abandoned.abort();
    await vi.advanceTimersByTimeAsync(5000);
    expect(h.beats()).toBe(2);
    expect(vi.getTimerCount()).toBe(0);
  });
});
