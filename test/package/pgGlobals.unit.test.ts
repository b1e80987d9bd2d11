import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { cairnTypes } from '../../src/db/pool.js';

describe("pg's global type parsers", () => {
  it('importing every entry point and creating a database leaves pg.types.getTypeParser(20) unchanged', async () => {
    const before = pg.types.getTypeParser(pg.types.builtins.INT8);
    const lib = await import('../../src/index.js');
    await import('../../relay/index.js');
    await import('../../consumers/index.js');
    // createDb makes its pool without connecting: nothing here needs a server.
    const db = lib.createDb({ connectionString: 'postgres://nobody@127.0.0.1:1/none' });
    await db.destroy();
    expect(pg.types.getTypeParser(pg.types.builtins.INT8)).toBe(before);
    expect(pg.types.getTypeParser(20)('9007199254740993')).toBe('9007199254740993');
    // Transforming every entry point's modules took 3.5-5 s on a busy machine: past vitest's 5 s default.
  }, 30_000);

  it("Cairn's own parsers read int8 as a number and defer to pg's globals for everything else", () => {
    expect(cairnTypes.getTypeParser(20, 'text')('42')).toBe(42);
    expect(cairnTypes.getTypeParser(23, 'text')).toBe(pg.types.getTypeParser(23, 'text'));
    expect(cairnTypes.getTypeParser(20, 'binary')).toBe(pg.types.getTypeParser(20, 'binary'));
  });
});
