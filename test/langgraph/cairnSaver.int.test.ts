import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { RunnableConfig } from '@langchain/core/runnables';
import { Annotation, END, START, StateGraph } from '@langchain/langgraph';
import { type Checkpoint, emptyCheckpoint, uuid6 } from '@langchain/langgraph-checkpoint';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CairnSaver } from '../../langgraph/index.js';
import { localKeyring, writeKeyring } from '../../src/crypto/keyProvider.js';
import { createTenantKeys } from '../../src/crypto/tenantKeys.js';
import type { Db } from '../../src/db/database.js';
import { placeHold, releaseHold } from '../../src/retention/holds.js';
import { switchableProvider } from '../support/keyProviders.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

const ring = { current: 'k1', keys: { k1: Buffer.alloc(32, 1) } };
let t: TestDatabase;
let asA: Db;
let asB: Db;
let app: Db;
let keyringPath: string;

beforeAll(async () => {
  t = await createTestDatabase('langgraph_saver');
  ({ app, asA, asB } = await twoTenants(t));
  keyringPath = join(mkdtempSync(join(tmpdir(), 'cairn-lg-keys-')), 'keyring.json');
  writeKeyring(keyringPath);
});
afterAll(async () => {
  await app?.destroy();
  await t?.drop();
});

const meta = (step: number, source: 'input' | 'loop' = 'loop') => ({ source, step, parents: {} });

/** A checkpoint with one channel value, as LangGraph hands it to put. */
function checkpointWith(values: Record<string, unknown>, version: number): Checkpoint {
  return {
    ...emptyCheckpoint(),
    id: uuid6(-1),
    channel_values: values,
    channel_versions: Object.fromEntries(Object.keys(values).map((k) => [k, version])),
  };
}

/** Puts `n` checkpoints in a row on a thread; returns their configs, oldest first. */
async function history(saver: CairnSaver, thread: string, n: number) {
  const configs = [];
  let config: RunnableConfig = { configurable: { thread_id: thread, checkpoint_ns: '' } };
  for (let i = 0; i < n; i++) {
    const cp = checkpointWith({ notes: `step ${i}` }, i + 1);
    config = await saver.put(config, cp, meta(i, i === 0 ? 'input' : 'loop'), cp.channel_versions);
    await saver.putWrites(config, [['notes', `pending after ${i}`]], `task-${i}`);
    configs.push(config);
  }
  return configs as Array<{
    configurable: { thread_id: string; checkpoint_ns: string; checkpoint_id: string };
  }>;
}

const events = (thread: string) =>
  sql<{ checkpoint_id: string; event: string; detail: string }>`
    SELECT checkpoint_id, event, detail FROM lg_event WHERE thread_id = ${thread} ORDER BY id`.execute(t.db);

describe('CairnSaver: compare-and-swap on the thread head', () => {
  it('two writers continue from the same head: exactly one put lands, the other is refused and recorded', async () => {
    const saver = new CairnSaver({ db: t.db, keyRing: ring });
    const [head] = await history(saver, 'cas-1', 1);
    const attempts = await Promise.allSettled(
      Array.from({ length: 8 }, (_, i) => {
        const cp = checkpointWith({ notes: `writer ${i}` }, 2);
        return saver.put(head!, cp, meta(1), cp.channel_versions);
      }),
    );
    expect(attempts.filter((a) => a.status === 'fulfilled')).toHaveLength(1);
    const refused = attempts.filter((a) => a.status === 'rejected');
    expect(refused).toHaveLength(7);
    for (const r of refused)
      expect((r as PromiseRejectedResult).reason).toMatchObject({ code: 'checkpoint_conflict' });
    const listed = [];
    for await (const tuple of saver.list({ configurable: { thread_id: 'cas-1' } })) listed.push(tuple);
    expect(listed).toHaveLength(2); // one history, no fork
    expect((await events('cas-1')).rows.filter((e) => e.event === 'fork_refused')).toHaveLength(7);
  });

  it('a put from an older checkpoint (a stale writer) is refused; forks: allow lets time travel fork', async () => {
    const saver = new CairnSaver({ db: t.db });
    const [first] = await history(saver, 'cas-2', 3);
    const cp = checkpointWith({ notes: 'from the past' }, 9);
    await expect(saver.put(first!, cp, meta(1), cp.channel_versions)).rejects.toMatchObject({
      code: 'checkpoint_conflict',
      message: expect.stringContaining(`the parent ${first!.configurable.checkpoint_id} is not the head`),
    });
    const forking = new CairnSaver({ db: t.db, forks: 'allow' });
    const forked = await forking.put(first!, cp, meta(1), cp.channel_versions);
    expect((await forking.getTuple(forked))?.parentConfig?.configurable?.checkpoint_id).toBe(
      first!.configurable.checkpoint_id,
    );
  });

  it('the same put again (a retry after a lost reply) is accepted once; other content under the same id is refused', async () => {
    const saver = new CairnSaver({ db: t.db });
    const [head] = await history(saver, 'cas-3', 1);
    const cp = checkpointWith({ notes: 'next' }, 2);
    const a = await saver.put(head!, cp, meta(1), cp.channel_versions);
    expect(await saver.put(head!, cp, meta(1), cp.channel_versions)).toEqual(a);
    const other = { ...cp, channel_values: { notes: 'something else' } };
    await expect(saver.put(head!, other, meta(1), cp.channel_versions)).rejects.toMatchObject({
      code: 'checkpoint_conflict',
    });
  });

  it('LangGraph surfaces the refusal: a graph run from a stale head rejects with checkpoint_conflict', async () => {
    const saver = new CairnSaver({ db: t.db });
    const State = Annotation.Root({ n: Annotation<number>({ reducer: (a, b) => a + b, default: () => 0 }) });
    const graph = new StateGraph(State)
      .addNode('add', () => ({ n: 1 }))
      .addEdge(START, 'add')
      .addEdge('add', END)
      .compile({ checkpointer: saver });
    const thread = { configurable: { thread_id: 'cas-graph' } };
    await graph.invoke({ n: 1 }, thread);
    const stale = await saver.getTuple(thread); // a second writer read the head...
    await graph.invoke({ n: 1 }, thread); // ...the first moved it...
    // ...and the second continues from what it read.
    await expect(graph.invoke({ n: 1 }, stale!.config)).rejects.toMatchObject({
      code: 'checkpoint_conflict',
    });
    expect((await graph.getState(thread)).values.n).toBe(4);
  });
});

describe('CairnSaver: integrity', () => {
  it('a flipped byte in the newest checkpoint: getTuple falls back to the one before, records it, and never returns it by id', async () => {
    const saver = new CairnSaver({ db: t.db, keyRing: ring });
    const configs = await history(saver, 'flip-1', 3);
    const newest = configs[2]!.configurable.checkpoint_id;
    await sql`UPDATE lg_blob SET blob = set_byte(blob, 2, get_byte(blob, 2) # 1)
               WHERE thread_id = 'flip-1' AND version = '3'`.execute(t.db);
    const tuple = await saver.getTuple({ configurable: { thread_id: 'flip-1' } });
    expect(tuple?.config.configurable?.checkpoint_id).toBe(configs[1]!.configurable.checkpoint_id);
    expect(tuple?.checkpoint.channel_values).toEqual({ notes: 'step 1' });
    expect((await events('flip-1')).rows).toEqual([
      {
        checkpoint_id: newest,
        event: 'skipped_invalid',
        detail: expect.stringContaining('does not match its digest'),
      },
    ]);
    await expect(saver.getTuple(configs[2]!)).rejects.toMatchObject({ code: 'checkpoint_invalid' });
    const listed = [];
    for await (const x of saver.list({ configurable: { thread_id: 'flip-1' } }))
      listed.push(x.config.configurable?.checkpoint_id);
    expect(listed).not.toContain(newest);
    await saver.getTuple({ configurable: { thread_id: 'flip-1' } });
    expect((await events('flip-1')).rows).toHaveLength(1); // read again: recorded once
    // A graph resumed from the fallback continues from it: the corrupt head is no head.
    const next = checkpointWith({ notes: 'resumed' }, 4);
    const resumed = await saver.put(tuple!.config, next, meta(3), next.channel_versions);
    expect((await saver.getTuple({ configurable: { thread_id: 'flip-1' } }))?.config).toEqual(resumed);
  });

  it('every row is checked: checkpoint bytes, pending writes, a row moved to another thread, a deleted parent', async () => {
    const saver = new CairnSaver({ db: t.db, keyRing: ring });
    const c1 = await history(saver, 'flip-2', 2);
    await sql`UPDATE lg_checkpoint SET checkpoint = set_byte(checkpoint, 3, get_byte(checkpoint, 3) # 4)
               WHERE checkpoint_id = ${c1[1]!.configurable.checkpoint_id}`.execute(t.db);
    await expect(saver.getTuple(c1[1]!)).rejects.toThrow(/bytes do not match its digest/);

    const c2 = await history(saver, 'flip-3', 1);
    await sql`UPDATE lg_write SET blob = convert_to('"forged"', 'UTF8') WHERE thread_id = 'flip-3'`.execute(
      t.db,
    );
    await expect(saver.getTuple(c2[0]!)).rejects.toThrow(/pending write task-0\/0 does not match its digest/);

    // A whole checkpoint copied under another thread id: the digest binds the thread.
    await history(saver, 'flip-4', 1);
    await sql`INSERT INTO lg_checkpoint
               SELECT (jsonb_populate_record(c, jsonb_build_object('thread_id', 'flip-5'))).*
                 FROM lg_checkpoint c WHERE thread_id = 'flip-4'`.execute(t.db);
    expect(await saver.getTuple({ configurable: { thread_id: 'flip-5' } })).toBeUndefined();

    const c3 = await history(saver, 'flip-6', 2);
    await sql`DELETE FROM lg_checkpoint WHERE checkpoint_id = ${c3[0]!.configurable.checkpoint_id}`.execute(
      t.db,
    );
    await expect(saver.getTuple(c3[1]!)).rejects.toThrow(/its parent .* is gone/);

    // A value the checkpoint wrote itself, deleted: its digest names it.
    const c4 = await history(saver, 'flip-7', 1);
    await sql`DELETE FROM lg_blob WHERE thread_id = 'flip-7'`.execute(t.db);
    await expect(saver.getTuple(c4[0]!)).rejects.toThrow(/channel notes \(version 1\) is missing/);
  });

  it('a forger without the key who recomputes the digests is caught by the signature; unsigned rows too', async () => {
    const unsigned = new CairnSaver({ db: t.db });
    const configs = await history(unsigned, 'sig-1', 1);
    const signed = new CairnSaver({ db: t.db, keyRing: ring });
    await expect(signed.getTuple(configs[0]!)).rejects.toThrow(/not signed but a key ring is configured/);
    const otherKey = new CairnSaver({
      db: t.db,
      keyRing: { current: 'k9', keys: { k9: Buffer.alloc(32, 9) } },
    });
    const forged = await history(otherKey, 'sig-2', 1);
    await sql`UPDATE lg_checkpoint SET sig_key = 'k1' WHERE thread_id = 'sig-2'`.execute(t.db);
    await sql`UPDATE lg_blob SET sig_key = 'k1' WHERE thread_id = 'sig-2'`.execute(t.db);
    await sql`UPDATE lg_write SET sig_key = 'k1' WHERE thread_id = 'sig-2'`.execute(t.db);
    await expect(signed.getTuple(forged[0]!)).rejects.toThrow(/signature does not match \(key k1\)/);
  });
});

describe('CairnSaver: tenants', () => {
  it("tenant A's thread is invisible to tenant B, through the saver and through B's own SQL", async () => {
    const a = new CairnSaver({ db: asA });
    const b = new CairnSaver({ db: asB });
    const [cfg] = await history(a, 'shared-name', 1);
    expect(await b.getTuple({ configurable: { thread_id: 'shared-name' } })).toBeUndefined();
    expect(await b.getTuple(cfg!)).toBeUndefined();
    const listed = [];
    for await (const x of b.list({ configurable: {} })) listed.push(x);
    expect(listed).toEqual([]);
    const { rows } = await sql`SELECT count(*)::int AS n FROM lg_checkpoint`.execute(asB);
    expect(rows).toEqual([{ n: 0 }]);
    // B writes under A's name by hand: row-level security refuses it.
    await expect(
      sql`INSERT INTO lg_event (tenant_id, thread_id, checkpoint_ns, checkpoint_id, event, detail)
          VALUES ('tenant-a', 'shared-name', '', 'x', 'fork_refused', 'forged')`.execute(asB),
    ).rejects.toThrow(/permission denied/); // events are the saver's to write (cairn_lg_record)
    await expect(
      sql`INSERT INTO lg_thread (tenant_id, thread_id, checkpoint_ns) VALUES ('tenant-a', 'shared-name', 'x')`.execute(
        asB,
      ),
    ).rejects.toThrow(/row-level security/);
    // B's own thread of the same name is B's alone; deleting it leaves A's.
    await history(b, 'shared-name', 2);
    await b.deleteThread('shared-name');
    expect(
      (await a.getTuple({ configurable: { thread_id: 'shared-name' } }))?.checkpoint.channel_values,
    ).toEqual({
      notes: 'step 0',
    });
    // The application role acting for no tenant sees neither.
    expect(
      await new CairnSaver({ db: app }).getTuple({ configurable: { thread_id: 'shared-name' } }),
    ).toBeUndefined();
  });

  it('with tenant keys, values and writes are stored encrypted; a key provider that is down is an outage, not corruption', async () => {
    const keys = createTenantKeys({ db: t.db, provider: localKeyring(keyringPath) });
    await keys.addTenant('tenant-a');
    const saver = new CairnSaver({ db: asA, keys, keyRing: ring });
    const cp = checkpointWith({ notes: 'SECRET-PLAN-4711' }, 1);
    const cfg = await saver.put(
      { configurable: { thread_id: 'enc-1' } },
      cp,
      meta(0, 'input'),
      cp.channel_versions,
    );
    await saver.putWrites(cfg, [['notes', 'SECRET-WRITE-4711']], 'task');
    const { rows } = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM (SELECT blob FROM lg_blob WHERE thread_id = 'enc-1'
                                      UNION ALL SELECT blob FROM lg_write WHERE thread_id = 'enc-1') x
       WHERE position(convert_to('SECRET', 'UTF8') IN blob) > 0`.execute(t.db);
    expect(rows).toEqual([{ n: 0 }]);
    expect((await saver.getTuple(cfg))?.pendingWrites).toEqual([['task', 'notes', 'SECRET-WRITE-4711']]);

    const { provider, s } = switchableProvider(localKeyring(keyringPath));
    s.down = true;
    const reader = new CairnSaver({ db: asA, keys: createTenantKeys({ db: t.db, provider }), keyRing: ring });
    await expect(reader.getTuple({ configurable: { thread_id: 'enc-1' } })).rejects.toThrow(
      /KMS unreachable/,
    );
    expect((await events('enc-1')).rows).toEqual([]); // nothing was taken for corruption
    s.down = false;
    expect(
      (await reader.getTuple({ configurable: { thread_id: 'enc-1' } }))?.checkpoint.channel_values,
    ).toEqual({
      notes: 'SECRET-PLAN-4711',
    });
  });

  it('a legal hold on the tenant refuses deleting its threads and compacting them; released, both work', async () => {
    const saver = new CairnSaver({ db: asA });
    const c = await history(saver, 'held-1', 3);
    await saver.markBoundary(c[2]!); // step 1 is now compactable
    await placeHold(t.db, { tenantId: 'tenant-a', reason: 'litigation 42', actor: 'legal' });
    await expect(saver.deleteThread('held-1')).rejects.toMatchObject({ code: 'legal_hold' });
    await expect(saver.compact('held-1')).rejects.toMatchObject({ code: 'legal_hold' });
    await expect(sql`DELETE FROM lg_checkpoint WHERE thread_id = 'held-1'`.execute(asA)).rejects.toThrow(
      /legal hold/,
    );
    expect(await saver.getTuple({ configurable: { thread_id: 'held-1' } })).toBeDefined();
    await releaseHold(t.db, { tenantId: 'tenant-a', actor: 'legal' });
    expect(await saver.compact('held-1')).toEqual({ removed: 1 });
    await saver.deleteThread('held-1');
    expect(await saver.getTuple({ configurable: { thread_id: 'held-1' } })).toBeUndefined();
  });
});

describe('CairnSaver: semantic boundaries and compaction', () => {
  it('compaction removes the steps before the newest boundary; what stays still verifies, the head among it', async () => {
    const saver = new CairnSaver({ db: t.db, keyRing: ring });
    const c = await history(saver, 'compact-1', 4); // step 0 is a boundary (source: input)
    expect(await saver.markBoundary(c[2]!)).toBe(true);
    expect(await saver.compact('compact-1')).toEqual({ removed: 1 }); // step 1
    const ids = [];
    for await (const x of saver.list({ configurable: { thread_id: 'compact-1' } }))
      ids.push(x.config.configurable?.checkpoint_id);
    expect(ids).toEqual([c[3], c[2], c[0]].map((x) => x!.configurable.checkpoint_id));
    expect((await saver.getTuple(c[2]!))?.checkpoint.channel_values).toEqual({ notes: 'step 2' }); // its parent was compacted
    expect(await saver.compact('compact-1')).toEqual({ removed: 0 }); // run twice: nothing more
    const { rows } = await sql<{
      n: number;
    }>`SELECT count(*)::int AS n FROM lg_blob WHERE thread_id = 'compact-1'`.execute(t.db);
    expect(rows).toEqual([{ n: 3 }]); // the compacted step's blob went with it
  });

  it('options are checked by name', () => {
    expect(() => new CairnSaver({ db: t.db, forks: 'maybe' } as never)).toThrow(/forks/);
    expect(() => new CairnSaver({ db: t.db, fence: true } as never)).toThrow(/fence/);
    expect(
      () =>
        new CairnSaver({
          db: t.db,
          keys: createTenantKeys({ db: t.db, provider: localKeyring(keyringPath) }),
        }),
    ).toThrow(/forTenant/);
  });
});
