/**
 * A checkpoint whose digest and signature verify but that this saver's serializer cannot decode
 * (written by a newer release, read by an older one) is a limitation of the reader, not
 * corruption (invariant 13): reading it throws a configuration error naming the thread and the
 * checkpoint, and nothing is recorded, so the thread's head stays where the writer put it.
 */
import type { RunnableConfig } from '@langchain/core/runnables';
import {
  type Checkpoint,
  emptyCheckpoint,
  JsonPlusSerializer,
  type SerializerProtocol,
  uuid6,
} from '@langchain/langgraph-checkpoint';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CairnSaver } from '../../langgraph/index.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const ring = { current: 'k1', keys: { k1: Buffer.alloc(32, 7) } };
let t: TestDatabase;

beforeAll(async () => {
  t = await createTestDatabase('langgraph_undecodable');
});
afterAll(async () => {
  await t?.drop();
});

/** The serializer of an older release: it throws on anything a newer one wrote ('v2-only'). */
function olderSerde(): SerializerProtocol {
  const inner = new JsonPlusSerializer();
  return {
    dumpsTyped: (value) => inner.dumpsTyped(value),
    loadsTyped: async (type, data) => {
      const text = typeof data === 'string' ? data : Buffer.from(data).toString('utf8');
      if (text.includes('v2-only')) throw new Error(`cannot read a ${type} value of a newer format`);
      return inner.loadsTyped(type, data);
    },
  };
}

const meta = (step: number, extra: Record<string, unknown> = {}) => ({
  source: 'loop' as const,
  step,
  parents: {},
  ...extra,
});

function checkpointWith(values: Record<string, unknown>, version: number): Checkpoint {
  return {
    ...emptyCheckpoint(),
    id: uuid6(-1),
    channel_values: values,
    channel_versions: Object.fromEntries(Object.keys(values).map((k) => [k, version])),
  };
}

const root = (thread: string): RunnableConfig => ({ configurable: { thread_id: thread, checkpoint_ns: '' } });
const idOf = (c: RunnableConfig) => String(c.configurable?.checkpoint_id);

const events = async (thread: string) =>
  (
    await sql<{ checkpoint_id: string; event: string }>`
      SELECT checkpoint_id, event FROM lg_event WHERE thread_id = ${thread} ORDER BY id`.execute(t.db)
  ).rows;

/** c1, then c2 (parent c1) that only a newer reader decodes: in its metadata, a value or a pending write. */
async function twoCheckpoints(writer: CairnSaver, thread: string, newer: 'metadata' | 'value' | 'write') {
  const one = checkpointWith({ notes: 'step 0' }, 1);
  const c1 = await writer.put(root(thread), one, meta(0), one.channel_versions);
  const two = checkpointWith({ notes: newer === 'value' ? 'v2-only' : 'step 1' }, 2);
  const c2 = await writer.put(
    c1,
    two,
    meta(1, newer === 'metadata' ? { feature: 'v2-only' } : {}),
    two.channel_versions,
  );
  if (newer === 'write') await writer.putWrites(c2, [['notes', 'v2-only']], 'task-1');
  return { c1, c2 };
}

describe('CairnSaver: a checkpoint that verifies but does not decode', () => {
  for (const newer of ['metadata', 'value', 'write'] as const) {
    it(`(${newer}) throws a configuration error naming it, records nothing, and the thread continues from it once read`, async () => {
      const thread = `undecodable-${newer}`;
      const writer = new CairnSaver({ db: t.db, keyRing: ring });
      const { c2 } = await twoCheckpoints(writer, thread, newer);
      const older = new CairnSaver({ db: t.db, keyRing: ring, serde: olderSerde() });

      const expected = {
        code: 'configuration',
        message: expect.stringMatching(new RegExp(`checkpoint ${idOf(c2)} of thread ${thread}.*verifies`)),
      };
      await expect(older.getTuple(root(thread))).rejects.toMatchObject(expected);
      await expect(older.getTuple(c2)).rejects.toMatchObject(expected);
      const listing = async () => {
        for await (const _ of older.list({ configurable: { thread_id: thread } })) {
          // reading is enough
        }
      };
      await expect(listing()).rejects.toMatchObject(expected);
      // Compaction walks from the newest checkpoint that verifies: it stops rather than walk past it.
      await expect(older.compact(thread)).rejects.toMatchObject(expected);
      expect(await events(thread)).toEqual([]);

      // The reader upgraded: it reads c2, and the writer continues from it.
      const newest = await writer.getTuple(root(thread));
      expect(idOf(newest!.config)).toBe(idOf(c2));
      const three = checkpointWith({ notes: 'step 2' }, 3);
      const c3 = await writer.put(c2, three, meta(2), three.channel_versions);
      expect(idOf((await writer.getTuple(root(thread)))!.config)).toBe(idOf(c3));
    });
  }

  it('a mark an older release recorded for a checkpoint it could not decode does not move the head back', async () => {
    const thread = 'undecodable-marked';
    const writer = new CairnSaver({ db: t.db, keyRing: ring });
    const { c2 } = await twoCheckpoints(writer, thread, 'metadata');
    // What an older release's getTuple recorded (verbatim), as the owner's connection does.
    await sql`SELECT cairn_lg_record(${thread}, '', ${idOf(c2)}, 'skipped_invalid',
                                     'does not decode: cannot read a json value of a newer format')`.execute(
      t.db,
    );
    expect(idOf((await writer.getTuple(root(thread)))!.config)).toBe(idOf(c2));
    const three = checkpointWith({ notes: 'step 2' }, 3);
    const c3 = await writer.put(c2, three, meta(2), three.channel_versions);
    expect(idOf((await writer.getTuple(root(thread)))!.config)).toBe(idOf(c3));
  });

  it('a checkpoint that fails its digest is still skipped, recorded, and no head', async () => {
    const thread = 'undecodable-flipped';
    const writer = new CairnSaver({ db: t.db, keyRing: ring });
    const { c1, c2 } = await twoCheckpoints(writer, thread, 'metadata');
    await sql`UPDATE lg_checkpoint SET checkpoint = set_byte(checkpoint, 3, get_byte(checkpoint, 3) # 4)
               WHERE thread_id = ${thread} AND checkpoint_id = ${idOf(c2)}`.execute(t.db);
    const older = new CairnSaver({ db: t.db, keyRing: ring, serde: olderSerde() });
    expect(idOf((await older.getTuple(root(thread)))!.config)).toBe(idOf(c1));
    expect(await events(thread)).toEqual([{ checkpoint_id: idOf(c2), event: 'skipped_invalid' }]);
    const three = checkpointWith({ notes: 'from c1' }, 3);
    await expect(writer.put(c1, three, meta(2), three.channel_versions)).resolves.toBeDefined();
  });
});
