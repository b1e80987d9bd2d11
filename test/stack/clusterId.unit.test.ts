import { describe, expect, it } from 'vitest';
import { newClusterId } from '../../cli/stack/kafka.js';

describe('local broker cluster id', () => {
  it('never starts with "-" (the storage tool read such an id as an option, one start in 64 failed)', () => {
    const ids = Array.from({ length: 2000 }, newClusterId); // 2000 draws hit a leading '-' about 31 times
    expect(ids.filter((id) => id.startsWith('-'))).toEqual([]);
    for (const id of ids) expect(id).toMatch(/^[A-Za-z0-9_][A-Za-z0-9_-]{21}$/);
  });
});
