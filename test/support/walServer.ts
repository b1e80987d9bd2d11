import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { afterAll, afterEach, beforeAll } from 'vitest';
import { createRelay, type Relay } from '../../relay/relay.js';
import { type PgServer, startPrimary } from '../../scripts/failover/pgCluster.js';
import { createDb, type Db } from '../../src/db/database.js';
import { migrateToLatest } from '../../src/db/migrate.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import type { Logger } from '../../src/logger.js';
import { kafkaBrokers } from './testDatabase.js';

/** A migrated database on the logical server, and a slot name no other test uses. */
export interface WalDatabase {
  url: string;
  db: Db;
  slot: string;
}

/**
 * For a test file of the relay's WAL mode: a throw-away server with wal_level = logical (the
 * one on 5432 runs replica) for the whole file, databases of its own on it, and relays that
 * are stopped after each test (their slots dropped: the server has 8).
 */
export function useLogicalServer(label: string) {
  let server: PgServer | undefined;
  let root: string | undefined;
  const relays: Array<{ relay: Relay; done: Promise<void> }> = [];
  const dbs: Db[] = [];

  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), `cairn-${label}-`));
    server = await startPrimary(root, label, { walLevel: 'logical' });
  }, 120_000);
  afterEach(async () => {
    for (const r of relays.splice(0)) {
      await r.relay.stop();
      await r.done.catch(() => {});
    }
    await server
      ?.query('SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active')
      .catch(() => {});
  });
  afterAll(async () => {
    for (const db of dbs) await db.destroy();
    await server?.stop();
    if (root) rmSync(root, { recursive: true, force: true });
  });

  const w = {
    get server(): PgServer {
      return server!;
    },
    async database(name: string): Promise<WalDatabase> {
      const dbName = `${label}_${name}_${randomBytes(3).toString('hex')}`;
      await server!.query(`CREATE DATABASE ${dbName}`);
      const url = server!.url(dbName);
      const db = createDb({ connectionString: url, max: 6 });
      dbs.push(db);
      await migrateToLatest(db);
      return { url, db, slot: `slot_${dbName}` };
    },
    /** Runs a relay until the test ends. */
    start(relay: Relay): Relay {
      relays.push({ relay, done: relay.run() });
      return relay;
    },
    /** A WAL relay on `d` (not started), with short leases and sweeps for tests. */
    walRelay(d: WalDatabase, extra: { instanceId?: string; logger?: Logger } = {}): Relay {
      return createRelay({
        db: d.db,
        publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
        maxIdleMs: 50,
        leaseTtlMs: 3000,
        wal: { connectionString: d.url, slot: d.slot, sweepEveryMs: 300 },
        ...extra,
      });
    },
    /** Whether the relay streams with every lane drained. */
    streaming(relay: Relay): boolean {
      const wal = relay.stats().wal;
      return wal?.streaming === true && wal.heldLanes === 0;
    },
    /** The schema the outbox is in (for a writer's own SQL). */
    async outboxSchema(db: Db): Promise<string> {
      const { rows } = await sql<{ s: string }>`
        SELECT n.nspname AS s FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.oid = 'outbox'::regclass`.execute(db);
      return rows[0]!.s;
    },
  };
  return w;
}
