import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { childLogFile } from '../../scripts/lib/spawnTs.js';

describe('child process logs (CAIRN_CHILD_LOG_DIR)', () => {
  const saved = process.env.CAIRN_CHILD_LOG_DIR;
  afterEach(() => {
    if (saved === undefined) delete process.env.CAIRN_CHILD_LOG_DIR;
    else process.env.CAIRN_CHILD_LOG_DIR = saved;
  });

  it('off without the variable', () => {
    delete process.env.CAIRN_CHILD_LOG_DIR;
    expect(childLogFile('relay-1')).toBeNull();
  });

  it('a name that is a path is one file in the folder, which is created (a missing subfolder failed the test run)', () => {
    const root = mkdtempSync(join(tmpdir(), 'cairn-child-logs-'));
    try {
      process.env.CAIRN_CHILD_LOG_DIR = join(root, 'not-yet');
      const file = childLogFile('test/support/effectConsumer.ts');
      expect(file).toBe(join(root, 'not-yet', 'test_support_effectConsumer.ts.log'));
      expect(existsSync(dirname(file!))).toBe(true);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});
