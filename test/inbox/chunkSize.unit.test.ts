import { describe, expect, it } from 'vitest';
import { chunkSizer, MAX_CHUNK } from '../../consumers/chunkSize.js';

describe('inbox chunk size', () => {
  it('a set chunkSize is the size of every chunk, however long they take', () => {
    const s = chunkSizer(100);
    s.took(100, 60_000);
    expect(s.next()).toBe(100);
  });

  it('without one, a chunk holds what the previous pace fits into a second, from 1 to MAX_CHUNK, growing at most twofold', () => {
    const s = chunkSizer(undefined);
    expect(s.next()).toBe(500);
    for (const size of [1000, 2000, 4000, MAX_CHUNK, MAX_CHUNK]) {
      s.took(s.next(), s.next() / 100); // 10 µs per message
      expect(s.next()).toBe(size);
    }
    s.took(MAX_CHUNK, 2 * MAX_CHUNK); // 2 ms per message: down at once
    expect(s.next()).toBe(500);
    s.took(500, 500 * 3000); // 3 s per message
    expect(s.next()).toBe(1);
    s.took(1, 0); // a quick one (a duplicate, say) does not make the next one large
    expect(s.next()).toBe(2);
  });
});
