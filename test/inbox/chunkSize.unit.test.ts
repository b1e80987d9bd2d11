import { describe, expect, it } from 'vitest';
import { chunkSizer, MAX_CHUNK } from '../../consumers/chunkSize.js';

describe('inbox chunk size', () => {
  it('a set chunkSize is the size of every chunk, however long they take', () => {
    const s = chunkSizer(100);
    s.took(100, 60_000);
    expect(s.next()).toBe(100);
  });

  it('without one, a chunk holds what the previous pace fits into a second, from 1 to MAX_CHUNK', () => {
    const s = chunkSizer(undefined);
    expect(s.next()).toBe(500);
    s.took(500, 5); // 10 µs per message
    expect(s.next()).toBe(MAX_CHUNK);
    s.took(MAX_CHUNK, 2 * MAX_CHUNK); // 2 ms per message
    expect(s.next()).toBe(500);
    s.took(500, 500 * 3000); // 3 s per message
    expect(s.next()).toBe(1);
    s.took(1, 0);
    expect(s.next()).toBe(MAX_CHUNK);
  });
});
