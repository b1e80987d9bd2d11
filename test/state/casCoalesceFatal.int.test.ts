// Coalesced updates (src/state/sql/casBatch.ts) when the session ends with the statement: an
// error after the commit (a FATAL or PANIC) must leave the outcome unknown, never "stale".
import { createConnection, createServer, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDb } from '../../src/db/database.js';
import { createTaskStore, type TaskStore } from '../../src/state/taskStore.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';
import { AGENT, newTask } from './fixtures.js';

let tdb: TestDatabase;
let store: TaskStore;
beforeAll(async () => {
  tdb = await createTestDatabase('cas_attack', { max: 12 });
  store = createTaskStore({ db: tdb.db });
});
afterAll(async () => {
  await tdb.drop();
});

async function created(ids: string[], through = store, tenant = 'acme'): Promise<void> {
  for (const id of ids) await through.create({ task: newTask(id, { tenant_id: tenant }), actor: AGENT });
}
function upd(taskId: string, through = store, expectedVersion = 1, tokens = 7) {
  return through.update({
    taskId,
    expectedVersion,
    patch: { budget: { tokens_spent: tokens } },
    actor: AGENT,
  });
}
async function _within<T>(p: Promise<T>, ms: number): Promise<T | 'pending'> {
  return Promise.race([p, sleep(ms).then(() => 'pending' as const)]);
}

/**
 * A loopback proxy to Postgres that, once armed, lets the batch statement run and commit, then
 * answers the client with a FATAL ErrorResponse carrying SQLSTATE XX000 (what a backend that
 * PANICs after writing its commit record sends: "cannot abort transaction ..., it was already
 * committed") and drops the connection.
 */
async function panicAfterCommitProxy(target: { host: string; port: number }) {
  let armed = false;
  let fired = 0;
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    const upstream = createConnection(target);
    sockets.add(client);
    sockets.add(upstream);
    for (const s of [client, upstream])
      s.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    client.pipe(upstream);
    let buf = Buffer.alloc(0);
    let inBatch = false;
    upstream.on('data', (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      const out: Buffer[] = [];
      while (buf.length >= 5) {
        const len = buf.readInt32BE(1);
        if (buf.length < 1 + len) break;
        const msg = buf.subarray(0, 1 + len);
        buf = buf.subarray(1 + len);
        const type = String.fromCharCode(msg[0]!);
        if (
          armed &&
          type === 'T' &&
          msg.includes(Buffer.from('locked\0')) &&
          msg.includes(Buffer.from('swapped\0'))
        ) {
          inBatch = true;
        }
        if (inBatch) {
          if (type === 'Z') {
            // Committed (ReadyForQuery follows the commit). Tell the client the session died.
            armed = false;
            inBatch = false;
            fired++;
            const fields = Buffer.concat([
              Buffer.from(
                'SFATAL\0VFATAL\0CXX000\0Mcannot abort transaction 1234, it was already committed\0',
              ),
              Buffer.from([0]),
            ]);
            const head = Buffer.alloc(5);
            head.write('E', 0);
            head.writeInt32BE(4 + fields.length, 1);
            if (out.length) client.write(Buffer.concat(out));
            client.end(Buffer.concat([head, fields]));
            upstream.destroy();
            return;
          }
          continue; // swallow the batch's answer
        }
        out.push(msg);
      }
      if (out.length) client.write(Buffer.concat(out));
    });
    upstream.on('end', () => client.end());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as { port: number }).port,
    arm: () => (armed = true),
    fired: () => fired,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

describe('an error with a SQLSTATE after the commit', () => {
  it('an update that committed is never answered stale (FATAL/PANIC is not "refused")', async () => {
    const u = new URL(tdb.url);
    const proxy = await panicAfterCommitProxy({ host: u.hostname, port: Number(u.port || 5432) });
    const via = new URL(tdb.url);
    via.hostname = '127.0.0.1';
    via.port = String(proxy.port);
    const own = createDb({ connectionString: via.toString(), max: 4 });
    const ownStore = createTaskStore({ db: own });
    try {
      await created(['pan-1', 'pan-2'], ownStore);
      proxy.arm();
      const results = await Promise.allSettled([upd('pan-1', ownStore), upd('pan-2', ownStore)]);
      const { rows } = await sql<{ task_id: string; version: number; actor: string }>`
        SELECT s.task_id, s.version::int, a.actor FROM task_state s
          JOIN task_audit a ON a.task_id = s.task_id AND a.version = s.version
         WHERE s.task_id IN ('pan-1', 'pan-2') ORDER BY s.task_id`.execute(tdb.db);
      const seen = results.map((r) =>
        r.status === 'rejected'
          ? `error: ${String(r.reason)}`
          : r.value.ok
            ? 'swapped'
            : `stale (${r.value.reason})`,
      );
      console.log('proxy fired', proxy.fired(), '| outcomes', seen, '| rows', rows);
      expect(proxy.fired()).toBe(1);
      // Both committed at version 2 with this writer's audit row...
      expect(rows.map((r) => r.version)).toEqual([2, 2]);
      // ...so neither may be answered stale: swapped, or an error ("outcome unknown").
      for (const s of seen) expect(s.startsWith('stale')).toBe(false);
    } finally {
      await own.destroy();
      await proxy.close();
    }
  });
});
