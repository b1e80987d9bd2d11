/**
 * Migration 0018: earlier releases recorded skipped_invalid for a checkpoint that verified but
 * that their serializer could not decode, and for one whose tenant data key did not unwrap;
 * cairn_lg_put then never took it for the head again, and a thread whose reader was fixed was
 * stuck (getTuple returned the checkpoint, a put continuing from it was refused as a fork).
 * Upgraded, such marks no longer move the head; a mark of real corruption still does.
 */
import type { RunnableConfig } from '@langchain/core/runnables';
import { type Checkpoint, emptyCheckpoint, uuid6 } from '@langchain/langgraph-checkpoint';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CairnSaver } from '../../langgraph/index.js';
import { migrateToLatest } from '../../src/db/migrate.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const ring = { current: 'k1', keys: { k1: Buffer.alloc(32, 9) } };
let t: TestDatabase;

beforeAll(async () => {
  t = await createTestDatabase('langgraph_head_marks', { migrateTo: '0016_lease_tokens' });
});
afterAll(async () => {
  await t?.drop();
});

function checkpointWith(notes: string, version: number): Checkpoint {
  return {
    ...emptyCheckpoint(),
    id: uuid6(-1),
    channel_values: { notes },
    channel_versions: { notes: version },
  };
}
const meta = (step: number) => ({ source: 'loop' as const, step, parents: {} });
const root = (thread: string): RunnableConfig => ({ configurable: { thread_id: thread, checkpoint_ns: '' } });
const idOf = (c: RunnableConfig) => String(c.configurable?.checkpoint_id);

/** c1, then c2 (parent c1), with c2 marked as an earlier release marked it. */
async function markedThread(saver: CairnSaver, thread: string, detail: string) {
  const one = checkpointWith('step 0', 1);
  const c1 = await saver.put(root(thread), one, meta(0), one.channel_versions);
  const two = checkpointWith('step 1', 2);
  const c2 = await saver.put(c1, two, meta(1), two.channel_versions);
  await sql`SELECT cairn_lg_record(${thread}, '', ${idOf(c2)}, 'skipped_invalid', ${detail})`.execute(t.db);
  return { c1, c2 };
}

const put = (saver: CairnSaver, parent: RunnableConfig, notes: string) => {
  const cp = checkpointWith(notes, 3);
  return saver.put(parent, cp, meta(2), cp.channel_versions);
};

describe('migration 0018: marks of a reader that could not read a row do not move the head', () => {
  it('a thread stuck by such a mark before the upgrade continues from its newest checkpoint after it; a corruption mark still counts', async () => {
    const saver = new CairnSaver({ db: t.db, keyRing: ring });
    // The details verbatim as the release before recorded them (langgraph/rowCodec.ts).
    const undecodable = await markedThread(
      saver,
      'marked-decode',
      'does not decode: Unexpected token in JSON at position 0',
    );
    const unwrapped = await markedThread(
      saver,
      'marked-unwrap',
      'channel notes does not decrypt: data key tenant-a/dk-1: authentication failed (a wrong key, ' +
        "another tenant's key, or altered bytes); nothing was returned",
    );
    const corrupt = await markedThread(saver, 'marked-corrupt', 'its bytes do not match its digest');

    // Before: getTuple returns c2 (it verifies), and a put continuing from it is refused.
    expect(idOf((await saver.getTuple(root('marked-decode')))!.config)).toBe(idOf(undecodable.c2));
    await expect(put(saver, undecodable.c2, 'stuck')).rejects.toMatchObject({
      code: 'checkpoint_conflict',
      message: expect.stringContaining(`is not the head of thread marked-decode (${idOf(undecodable.c1)})`),
    });

    expect(await migrateToLatest(t.db)).toContain('0018_lg_head_reader_marks');

    for (const [thread, { c2 }] of [
      ['marked-decode', undecodable],
      ['marked-unwrap', unwrapped],
    ] as const) {
      const c3 = await put(saver, c2, `continued ${thread}`);
      expect(idOf((await saver.getTuple(root(thread)))!.config)).toBe(idOf(c3));
    }
    // A corruption mark still takes its checkpoint out of the head: the put continues from c1.
    await expect(put(saver, corrupt.c2, 'from the marked one')).rejects.toMatchObject({
      code: 'checkpoint_conflict',
    });
    await expect(put(saver, corrupt.c1, 'from the fallback')).resolves.toBeDefined();
  });
});
