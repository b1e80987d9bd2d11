import type { RunnableConfig } from '@langchain/core/runnables';
import { type Checkpoint, emptyCheckpoint, uuid6 } from '@langchain/langgraph-checkpoint';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CairnSaver } from '../../langgraph/index.js';
import type { Db } from '../../src/db/database.js';
import { placeHold, releaseHold } from '../../src/retention/holds.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

/**
 * What an adversarial review of CairnSaver found, each as the scenario that broke it: a slow
 * writer, a fork that counts versions the same way, a tenant's own SQL (locks, holds, events,
 * the SQL copies of verified bytes, key ids), a parent replaced under a writer, compaction
 * fed corrupt or forged rows.
 */
const ring = { current: 'k1', keys: { k1: Buffer.alloc(32, 1) } };
let t: TestDatabase;
let app: Db;
let asA: Db;
let asB: Db;

beforeAll(async () => {
  t = await createTestDatabase('langgraph_adversary');
  ({ app, asA, asB } = await twoTenants(t));
});
afterAll(async () => {
  await app?.destroy();
  await t?.drop();
});

const meta = (step: number) => ({ source: step === 0 ? 'input' : 'loop', step, parents: {} }) as const;
const checkpointWith = (values: Record<string, unknown>, version: number): Checkpoint => ({
  ...emptyCheckpoint(),
  id: uuid6(-1),
  channel_values: values,
  channel_versions: Object.fromEntries(Object.keys(values).map((k) => [k, version])),
});
const root = (thread: string): RunnableConfig => ({ configurable: { thread_id: thread, checkpoint_ns: '' } });

async function history(saver: CairnSaver, thread: string, n: number, from: RunnableConfig = root(thread)) {
  const configs: RunnableConfig[] = [];
  let config = from;
  for (let i = 0; i < n; i++) {
    const cp = checkpointWith({ notes: `step ${i}` }, i + 1);
    config = await saver.put(config, cp, meta(i), cp.channel_versions);
    await saver.putWrites(config, [['notes', `pending after ${i}`]], `task-${i}`);
    configs.push(config);
  }
  return configs;
}
const idOf = (c: RunnableConfig | undefined) => c?.configurable?.checkpoint_id as string;
const events = async (thread: string) =>
  (
    await sql<{
      event: string;
      detail: string;
    }>`SELECT event, detail FROM lg_event WHERE thread_id = ${thread} ORDER BY id`.execute(t.db)
  ).rows;

describe('CairnSaver against a slow writer and forks', () => {
  it('a writer that saw the thread empty and comes back after another ran it is refused, not a silent reset', async () => {
    const slow = new CairnSaver({ db: t.db });
    const fast = new CairnSaver({ db: t.db });
    expect(await slow.getTuple(root('slow-1'))).toBeUndefined(); // ...then it pauses
    const done = await history(fast, 'slow-1', 3);
    const cp = checkpointWith({ notes: 'from an empty start' }, 1);
    await expect(slow.put(root('slow-1'), cp, meta(0), cp.channel_versions)).rejects.toMatchObject({
      code: 'checkpoint_conflict',
    });
    expect(idOf((await fast.getTuple(root('slow-1')))?.config)).toBe(idOf(done[2]));
    expect((await events('slow-1')).map((e) => e.event)).toEqual(['fork_refused']);
  });

  it('forks: allow, two branches giving a channel the same version: the second put is refused, never reported as stored', async () => {
    const saver = new CairnSaver({ db: t.db, forks: 'allow' });
    const [first] = await history(saver, 'branch-1', 1);
    const a = checkpointWith({ notes: 'branch a' }, 2);
    await saver.put(first!, a, meta(1), a.channel_versions);
    const b = checkpointWith({ notes: 'branch b' }, 2);
    await expect(saver.put(first!, b, meta(1), b.channel_versions)).rejects.toThrow(
      /another value is already stored/,
    );
    expect((await saver.getTuple(root('branch-1')))?.checkpoint.channel_values).toEqual({
      notes: 'branch a',
    });
  });

  it("a parent replaced after this saver wrote it: the child's put is refused, not chained onto it", async () => {
    const saver = new CairnSaver({ db: t.db, keyRing: ring });
    const [head] = await history(saver, 'replaced-1', 1);
    await sql`UPDATE lg_checkpoint SET digest = 'sha256:forged' WHERE thread_id = 'replaced-1'`.execute(t.db);
    const cp = checkpointWith({ notes: 'next' }, 2);
    await expect(saver.put(head!, cp, meta(1), cp.channel_versions)).rejects.toThrow(/its digest changed/);
  });
});

describe("CairnSaver against a tenant's own SQL", () => {
  it("tenant A cannot lock, block or probe tenant B's thread", async () => {
    const b = new CairnSaver({ db: asB });
    await history(b, 'locked-1', 1);
    await asA.transaction().execute(async (trx) => {
      const seen = await sql`SELECT 1 FROM lg_thread WHERE tenant_id = 'tenant-b' FOR UPDATE`.execute(trx);
      expect(seen.rows).toEqual([]); // row-level security: nothing to lock
      // While A's transaction is open, B's put goes through.
      const cp = checkpointWith({ notes: 'not blocked' }, 2);
      const head = await b.getTuple(root('locked-1'));
      await b.put(head!.config, cp, meta(1), cp.channel_versions);
    });
    await expect(
      sql`INSERT INTO lg_thread (tenant_id, thread_id, checkpoint_ns) VALUES ('tenant-b', 'locked-2', '')`.execute(
        asA,
      ),
    ).rejects.toThrow(/row-level security/);
    // The put function called by hand for B: it runs as A, so row-level security binds it.
    const none = sql`'{}'::text[]`;
    await expect(
      sql`SELECT * FROM cairn_lg_put('tenant-b', 'locked-3', '', 'x', NULL, true, 'w', NULL, ${Buffer.from('{}')}, 'json',
            ${Buffer.from('{}')}, 'json', '{}', '{}', '{}', false, 'd', NULL, NULL,
            ${none}, ${none}, ${none}, '{}'::bytea[], ${none}, ${none}, ${none}, ${none})`.execute(asA),
    ).rejects.toThrow(/row-level security/);
  });

  it('under a legal hold, no row of a held thread can be rewritten or its chain record deleted; place columns are never updatable', async () => {
    const saver = new CairnSaver({ db: asA, keyRing: ring });
    const c = await history(saver, 'held-2', 3);
    await saver.markBoundary(c[2]!);
    expect(await saver.compact('held-2')).toEqual({ removed: 1 });
    await expect(
      sql`UPDATE lg_write SET thread_id = 'elsewhere' WHERE thread_id = 'held-2'`.execute(asA),
    ).rejects.toThrow(/permission denied/);
    await placeHold(t.db, { tenantId: 'tenant-a', reason: 'audit 7', actor: 'legal' });
    try {
      await expect(
        sql`UPDATE lg_write SET blob = '' WHERE thread_id = 'held-2'`.execute(asA),
      ).rejects.toThrow(/legal hold/);
      await expect(sql`DELETE FROM lg_compacted WHERE thread_id = 'held-2'`.execute(asA)).rejects.toThrow(
        /legal hold/,
      );
      await expect(
        sql`UPDATE lg_checkpoint SET boundary = true WHERE thread_id = 'held-2'`.execute(asA),
      ).rejects.toThrow(/legal hold/);
    } finally {
      await releaseHold(t.db, { tenantId: 'tenant-a', actor: 'legal' });
    }
    expect((await saver.getTuple(root('held-2')))?.pendingWrites).toEqual([
      ['task-2', 'notes', 'pending after 2'],
    ]);
  });

  it('tenants cannot write events: a planted one is overwritten by what the saver saw', async () => {
    const saver = new CairnSaver({ db: asA, keyRing: ring });
    const c = await history(saver, 'events-1', 2);
    await expect(
      sql`INSERT INTO lg_event (tenant_id, thread_id, checkpoint_ns, checkpoint_id, event, detail)
          VALUES ('tenant-a', 'events-1', '', ${idOf(c[1])}, 'skipped_invalid', 'routine, ignore')`.execute(
        asA,
      ),
    ).rejects.toThrow(/permission denied/);
    await sql`SELECT cairn_lg_record('events-1', '', ${idOf(c[1])}, 'skipped_invalid', 'routine, ignore')`.execute(
      asA,
    );
    await sql`UPDATE lg_blob SET blob = set_byte(blob, 1, 65) WHERE thread_id = 'events-1' AND version = '2'`.execute(
      t.db,
    );
    expect(idOf((await saver.getTuple(root('events-1')))?.config)).toBe(idOf(c[0]));
    expect(await events('events-1')).toEqual([
      { event: 'skipped_invalid', detail: expect.stringContaining('does not match its digest') },
    ]);
  });

  it('the SQL copies of verified bytes (metadata for filters, versions for values) cannot change what is returned', async () => {
    const saver = new CairnSaver({ db: t.db, keyRing: ring });
    const c = await history(saver, 'copies-1', 2);
    await sql`UPDATE lg_checkpoint SET metadata_json = '{"approved": true}' WHERE checkpoint_id = ${idOf(c[1])}`.execute(
      t.db,
    );
    const approved = [];
    for await (const x of saver.list(root('copies-1'), { filter: { approved: true } })) approved.push(x);
    expect(approved).toEqual([]);
    expect(idOf((await saver.getTuple(root('copies-1')))?.config)).toBe(idOf(c[0]));

    const d = await history(saver, 'copies-2', 1);
    await sql`UPDATE lg_checkpoint SET versions = '{}' WHERE checkpoint_id = ${idOf(d[0])}`.execute(t.db);
    await expect(saver.getTuple(d[0]!)).rejects.toThrow(/versions column differs/);
  });

  it('a key id altered by hand is corruption (the signature covers it), not an outage that blocks the thread', async () => {
    const saver = new CairnSaver({ db: t.db, keyRing: ring });
    const c = await history(saver, 'keyid-1', 2);
    await sql`UPDATE lg_blob SET key_id = 'dk-bogus' WHERE thread_id = 'keyid-1' AND version = '2'`.execute(
      t.db,
    );
    expect(idOf((await saver.getTuple(root('keyid-1')))?.config)).toBe(idOf(c[0]));
    expect((await events('keyid-1'))[0]?.detail).toMatch(/signature does not match/);
  });
});

describe('CairnSaver compaction against corrupt and forged rows', () => {
  it('a corrupt newest boundary is not used: compaction keeps what getTuple resumes from', async () => {
    const saver = new CairnSaver({ db: t.db, keyRing: ring });
    const c = await history(saver, 'compact-2', 4);
    await saver.markBoundary(c[3]!);
    await sql`UPDATE lg_checkpoint SET checkpoint = set_byte(checkpoint, 3, get_byte(checkpoint, 3) # 1)
               WHERE checkpoint_id = ${idOf(c[3])}`.execute(t.db);
    const before = idOf((await saver.getTuple(root('compact-2')))?.config);
    expect(before).toBe(idOf(c[2]));
    expect(await saver.compact('compact-2')).toEqual({ removed: 0 }); // the only usable boundary is step 0
    expect(idOf((await saver.getTuple(root('compact-2')))?.config)).toBe(before);
  });

  it('a forged boundary row with a high id does not make compaction delete the real head', async () => {
    const saver = new CairnSaver({ db: asA, keyRing: ring });
    const c = await history(saver, 'compact-3', 3);
    await sql`INSERT INTO lg_checkpoint
               SELECT (jsonb_populate_record(x, jsonb_build_object('checkpoint_id', 'ffffffff-ffff-6fff-8fff-ffffffffffff',
                                                                    'boundary', true))).*
                 FROM lg_checkpoint x WHERE thread_id = 'compact-3' AND checkpoint_id = ${idOf(c[2])}`.execute(
      asA,
    );
    expect(await saver.compact('compact-3')).toEqual({ removed: 0 });
    expect(idOf((await saver.getTuple(root('compact-3')))?.config)).toBe(idOf(c[2]));
  });

  it('forks: allow: compaction follows the newest branch only and never removes another branch', async () => {
    const saver = new CairnSaver({ db: t.db, forks: 'allow' });
    const c = await history(saver, 'compact-4', 2);
    const other = checkpointWith({ other: 'branch' }, 1);
    const branchHead = await saver.put(c[0]!, other, meta(1), other.channel_versions);
    const main = await history(saver, 'compact-4', 2, c[1]);
    await saver.markBoundary(main[1]!);
    expect(await saver.compact('compact-4')).toEqual({ removed: 1 }); // step 1 of the newest branch
    expect((await saver.getTuple(branchHead))?.checkpoint.channel_values).toEqual({ other: 'branch' });
  });
});

describe('CairnSaver: second review', () => {
  it('a real graph resumed from the fallback past a corrupt head completes, with new values verified', async () => {
    const { Annotation, END, START, StateGraph } = await import('@langchain/langgraph');
    const saver = new CairnSaver({ db: t.db, keyRing: ring });
    const State = Annotation.Root({ n: Annotation<string>({ reducer: (_a, b) => b, default: () => '' }) });
    let steps = 0;
    const graph = new StateGraph(State)
      .addNode('a', () => ({ n: `a-${++steps}-${uuid6(-1)}` }))
      .addNode('b', () => ({ n: `b-${++steps}-${uuid6(-1)}` }))
      .addEdge(START, 'a')
      .addEdge('a', 'b')
      .addEdge('b', END)
      .compile({ checkpointer: saver });
    const config = { configurable: { thread_id: 'resume-real' } };
    await graph.invoke({ n: 'start' }, { ...config, durability: 'sync' });
    // The head's own value, corrupted: getTuple falls back to the checkpoint before it.
    const head = await saver.getTuple(config);
    await sql`UPDATE lg_blob SET blob = set_byte(blob, 2, get_byte(blob, 2) # 1)
               WHERE thread_id = 'resume-real' AND channel = 'n'
                 AND version = ${String(head!.checkpoint.channel_versions.n)}`.execute(t.db);
    const fallback = await saver.getTuple(config);
    expect(fallback?.config.configurable?.checkpoint_id).not.toBe(head!.config.configurable?.checkpoint_id);
    // Running the last step again writes that channel's next version: not the corrupt one.
    const state = await graph.getState(config);
    expect(state.tasks.length).toBeGreaterThan(0);
    const out = await graph.invoke(null, { ...config, durability: 'sync' });
    expect(out.n).toMatch(/^b-/);
    expect((await saver.getTuple(config))?.checkpoint.channel_values.n).toBe(out.n);
  });

  it('deleteThread while a put holds the thread: nothing the put wrote survives the delete', async () => {
    const saver = new CairnSaver({ db: t.db });
    await history(saver, 'delete-race', 1);
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    let locked!: () => void;
    const holding = new Promise<void>((r) => {
      locked = r;
    });
    // A put in progress: its transaction holds the thread's row until released.
    const put = t.db.transaction().execute(async (trx) => {
      await sql`SELECT 1 FROM lg_thread WHERE thread_id = 'delete-race' FOR UPDATE`.execute(trx);
      locked();
      await sql`INSERT INTO lg_write (tenant_id, thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, digest)
                VALUES ('', 'delete-race', '', 'late', 't', 0, 'c', 'json', '\\x00', 'd')`.execute(trx);
      await held;
    });
    await holding;
    const deleting = saver.deleteThread('delete-race');
    // Wait until the delete queues behind the put's lock, then let the put commit.
    const until = Date.now() + 30_000;
    for (;;) {
      const { rows } = await sql<{ n: number }>`
        SELECT count(*)::int AS n FROM pg_locks l JOIN pg_stat_activity a USING (pid)
         WHERE NOT l.granted AND a.datname = current_database()`.execute(t.db);
      if (rows[0]!.n > 0) break;
      if (Date.now() > until) throw new Error('the delete never waited for the put');
      await new Promise((r) => setTimeout(r, 20));
    }
    release();
    await put;
    await deleting;
    const { rows } = await sql<{ n: number }>`
      SELECT (SELECT count(*) FROM lg_write WHERE thread_id = 'delete-race')
           + (SELECT count(*) FROM lg_checkpoint WHERE thread_id = 'delete-race') AS n`.execute(t.db);
    expect(Number(rows[0]!.n)).toBe(0);
  });

  it('metadata holding a backslash and "u0000" as text is stored and read back unchanged', async () => {
    const saver = new CairnSaver({ db: t.db, keyRing: ring });
    const cp = checkpointWith({ notes: 'x' }, 1);
    const cfg = await saver.put(
      root('nul-text'),
      cp,
      { ...meta(0), note: 'path C:\\u0000x' } as never,
      cp.channel_versions,
    );
    expect((await saver.getTuple(cfg))?.metadata).toMatchObject({ note: 'path C:\\u0000x' });
  });
});
