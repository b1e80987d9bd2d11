import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { presentRows } from '../../relay/wal/walPresent.js';
import { prepareWal } from '../../relay/wal/walSetup.js';
import { allVisible } from '../../relay/wal/walVisibility.js';
import { findPgBin, startPrimary } from '../../scripts/failover/pgCluster.js';
import { createDb } from '../../src/db/database.js';
import { migrateToLatest } from '../../src/db/migrate.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, createTestTopic, kafkaBrokers } from '../support/testDatabase.js';
import { readTopic, waitFor } from '../support/topicReader.js';
import { useLogicalServer } from '../support/walServer.js';

// Issue 16: the second adversarial review of the WAL mode, each finding a test that failed
// before its fix: a commit not visible within the wait, xids widened in the wrong epoch, a row
// sent twice while the sweep's delete of it runs, ids (and lanes) planted by a tenant's own SQL.

const kafka = kafkaClient(kafkaBrokers(), 'wal-review2-test');
const wal = useLogicalServer('walrev2');

const insertRow = (schema: string, topic: string, key: string, value: string) =>
  `INSERT INTO ${schema}.outbox (lane, message_id, topic, key, payload)
   VALUES (0, gen_random_uuid(), '${topic}', '${key}', convert_to('${value}', 'UTF8'))`;

describe('issue 16: the WAL mode against the second review', () => {
  it('ORDER/LIVENESS: a streamed commit not visible within 2 s (its backend still waiting for a synchronous standby) is published, and before the next message of its key', async () => {
    await wal.server.query(`ALTER SYSTEM SET synchronous_commit = 'local'`);
    await wal.server.query(`ALTER SYSTEM SET synchronous_standby_names = 'ghost'`);
    await wal.server.query('SELECT pg_reload_conf()');
    let w: pg.Client | undefined;
    try {
      const d = await wal.database('late');
      const topic = await createTestTopic('wal-r2-late', 1);
      const schema = await wal.outboxSchema(d.db);
      const relay = wal.start(wal.walRelay(d));
      await waitFor('the stream to start and drain', async () => wal.streaming(relay), 30_000);
      const streamed0 = relay.stats().wal!.streamed;

      // A writer whose commit is in the WAL (the walsender sends it) but waits for a synchronous
      // standby before it leaves the proc array: invisible to new snapshots meanwhile.
      w = new pg.Client({ connectionString: d.url });
      await w.connect();
      await w.query(`SET synchronous_commit = 'on'`);
      const pid = (await w.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
      await w.query('BEGIN');
      await w.query(insertRow(schema, topic, 'k', 'A'));
      const committed = w.query('COMMIT').catch((e: Error) => e);

      await waitFor('the relay to take A', async () => relay.stats().wal!.streamed > streamed0, 20_000);
      // It now waits (2 s) for A to become visible; then holds its lanes and confirms the slot past A.
      const c0 = relay.stats().wal!.confirmedLsn;
      await waitFor(
        'the relay to give up waiting for A',
        async () => relay.stats().wal!.confirmedLsn !== c0,
        20_000,
      );
      // Its held lanes are swept (while A is still invisible) and let go: with a fix, they stay held.
      await waitFor('the held lanes swept', async () => relay.stats().wal!.heldLanes === 0, 5_000).catch(
        () => {},
      );

      // The standby wait ends (cancelled: the commit stands), A becomes visible; then B of the same key.
      await wal.server.query(`SELECT pg_cancel_backend(${pid})`, d.url.split('/').pop()!.split('?')[0]);
      await committed;
      await d.db.transaction().execute(async (t) => {
        await sql.raw(insertRow(schema, topic, 'k', 'B')).execute(t);
      });
      const got = await readTopic(kafka, topic, (ms) => ms.length >= 2, 15_000);
      const dbName = d.url.split('/').pop()!.split('?')[0];
      let left = '';
      await waitFor(
        'the outbox to empty',
        async () => {
          const r = await wal.server.query<{ n: string }>(
            `SELECT count(*)::text AS n FROM ${schema}.outbox`,
            dbName,
          );
          left = r[0]!.n;
          return left === '0';
        },
        5_000,
      ).catch(() => {});
      expect({ order: got.map((m) => m.value), leftInTable: left }).toEqual({
        order: ['A', 'B'],
        leftInTable: '0',
      });
    } finally {
      await w?.end().catch(() => {});
      await wal.server.query('ALTER SYSTEM RESET synchronous_standby_names');
      await wal.server.query('ALTER SYSTEM RESET synchronous_commit');
      await wal.server.query('SELECT pg_reload_conf()');
    }
  }, 120_000);

  it('DUPLICATE: a row the held-lane sweep published, its delete still running, is not published again when the stream hands it over', async () => {
    const d = await wal.database('dup');
    const topic = await createTestTopic('wal-r2-dup', 1);
    const schema = await wal.outboxSchema(d.db);
    // The slot exists before the row: the stream hands it over, and the first sweep reads it too.
    await prepareWal(d.db, { slot: d.slot, publication: 'cairn_outbox' });
    const admin = new pg.Client({ connectionString: d.url });
    await admin.connect();
    await admin.query(insertRow(schema, topic, 'd', 'd:1'));
    // The relay's delete of the row waits (as it would behind a busy table or a slow disk).
    await admin.query('BEGIN');
    await admin.query(`SELECT 1 FROM ${schema}.outbox FOR UPDATE`);
    try {
      wal.start(wal.walRelay(d));
      const whileDeleting = await readTopic(kafka, topic, (ms) => ms.length >= 2, 15_000);
      await admin.query('COMMIT');
      expect(whileDeleting.map((m) => m.value)).toEqual(['d:1']); // fails now: ['d:1', 'd:1']
    } finally {
      await admin.query('ROLLBACK').catch(() => {});
      await admin.end();
    }
  }, 120_000);

  it('VISIBILITY in xid epoch 1: a transaction newer than the snapshot xmax (committed in the WAL, not yet visible) is not reported visible', async () => {
    const root = mkdtempSync(join(tmpdir(), 'cairn-epoch-'));
    const s = await startPrimary(root, 'epoch', { walLevel: 'logical' });
    const bin = findPgBin();
    const asPg = (cmd: string, args: string[]) =>
      execFileSync('runuser', ['-u', 'postgres', '--', join(bin, cmd), ...args], { stdio: 'pipe' });
    await s.stop();
    asPg('pg_resetwal', ['-e', '1', s.dir]); // a server past its first 2^32 transactions
    asPg('pg_ctl', [
      '-D',
      s.dir,
      '-l',
      join(root, 'epoch.log'),
      '-o',
      `-p ${s.port} -k ${join(root, 'sockets')} -c listen_addresses=127.0.0.1`,
      'start',
      '-w',
    ]);
    const db = createDb({ connectionString: s.url(), max: 2 });
    const t1 = new pg.Client({ connectionString: s.url() });
    const t2 = new pg.Client({ connectionString: s.url() });
    try {
      await migrateToLatest(db);
      await t1.connect();
      await t2.connect();
      // Two writers in flight: the later one's xid is past the snapshot's xmax (latestCompletedXid + 1).
      await t1.query('BEGIN');
      const x1 = BigInt((await t1.query<{ x: string }>('SELECT pg_current_xact_id()::text AS x')).rows[0]!.x);
      await t2.query('BEGIN');
      const x2 = BigInt((await t2.query<{ x: string }>('SELECT pg_current_xact_id()::text AS x')).rows[0]!.x);
      expect(x1 >> 32n).toBe(1n);
      const low = Number(x2 & 0xffffffffn); // as pgoutput gives it
      const truth = (
        await s.query<{ v: boolean }>(
          `SELECT pg_visible_in_snapshot('${x2}'::xid8, pg_current_snapshot()) AS v`,
        )
      )[0]!.v;
      const present = await presentRows(db, [], [low]);
      const gate = await allVisible(db, [low]);
      expect({ truth, presentRows: present.visible, allVisible: gate }).toEqual({
        truth: false,
        presentRows: false, // fails now: true (x2 widened into epoch 0, "older than xmin")
        allVisible: false, // fails now: true
      });
    } finally {
      await t1.end().catch(() => {});
      await t2.end().catch(() => {});
      await db.destroy();
      await s.stop();
      rmSync(root, { recursive: true, force: true });
    }
  }, 120_000);

  it("LIVENESS (a tenant's own SQL): ids a tenant plants ahead of the outbox sequence, and lanes no relay owns, are refused; another tenant's writes go on", async () => {
    const t = await createTestDatabase('r2_ids');
    const { app, asA, asB } = await twoTenants(t, 2);
    try {
      const outbox = createOutbox();
      const [mid] = await asA
        .transaction()
        .execute((trx) => outbox.enqueue(trx, [{ topic: 'x', key: 'a', payload: Buffer.from('a') }]));
      const { rows } = await sql<{
        id: string;
      }>`SELECT id::text AS id FROM outbox WHERE message_id = ${mid!}::uuid`.execute(asA);
      const n = Number(rows[0]!.id);
      // Tenant A's own SQL: the next 20 ids, in a lane no relay owns (the rows would never be
      // published nor deleted). Refused: tenants insert the library's columns, not the id.
      const planted = await sql`INSERT INTO outbox (id, lane, message_id, topic, key, payload)
                SELECT g, 1000, gen_random_uuid(), 'x', 'planted', '\\x00'::bytea
                  FROM generate_series(${n + 1}::bigint, ${n + 20}::bigint) g`
        .execute(asA)
        .then(
          () => undefined,
          (e: { code?: string }) => e.code,
        );
      expect(planted).toBe('42501');
      // Without the id, a lane no relay owns is refused too.
      const unowned = await sql`INSERT INTO outbox (lane, message_id, topic, key, payload)
                VALUES (1000, gen_random_uuid(), 'x', 'planted', '\\x00'::bytea)`
        .execute(asA)
        .then(
          () => undefined,
          (e: { code?: string }) => e.code,
        );
      expect(unowned).toBe('23514');
      const failures: string[] = [];
      for (let i = 0; i < 3; i++) {
        await asB
          .transaction()
          .execute((trx) => outbox.enqueue(trx, [{ topic: 'y', key: 'b', payload: Buffer.from('b') }]))
          .catch((e: Error) => failures.push(e.message));
      }
      expect(failures).toEqual([]);
    } finally {
      await app.destroy();
      await t.drop();
    }
  }, 60_000);
});
