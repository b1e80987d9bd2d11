import { sql } from 'kysely';
import { v5 as uuidv5 } from 'uuid';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { insertInboxRows } from '../../consumers/sql/insertInboxRows.js';
import { claimBatch } from '../../relay/sql/claimBatch.js';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import type { Db } from '../../src/db/database.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { laneOf } from '../../src/outbox/lanes.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { createReceiptStore, idempotencyKeyOf } from '../../src/receipts/receipts.js';
import { annotate } from '../../src/retention/holds.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { parkAsLaneOwner } from '../support/parkKey.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

/**
 * A tenant that runs its own SQL on the connection Cairn gives it (issue 21): every attempt
 * to read, write or plant rows as another tenant, to override a guard, or to resolve its own
 * gate is refused or invisible, and the other tenant's work goes on unharmed.
 */
let t: TestDatabase;
let app: Db;
let asA: Db;
let asB: Db;
const OPERATOR = 'spiffe://acme.example/operator/alice';

async function ownerCount(query: ReturnType<typeof sql<{ n: number }>>): Promise<number> {
  return (await query.execute(t.db)).rows[0]!.n;
}

beforeAll(async () => {
  t = await createTestDatabase('tenant_sql');
  ({ app, asA, asB } = await twoTenants(t, 2));
  for (const [db, tenant] of [
    [asA, 'tenant-a'],
    [asB, 'tenant-b'],
  ] as const) {
    const store = createTaskStore({ db, checkpointer: createCheckpointer({ db }) });
    for (const n of [1, 2, 3]) {
      await store.create({ task: newTask(`${tenant[7]}-${n}`, { tenant_id: tenant }), actor: AGENT });
    }
  }
});

afterAll(async () => {
  await app?.destroy();
  await t?.drop();
});

describe("a tenant's own SQL on its own connection", () => {
  it('cannot become another tenant by changing a setting', async () => {
    const seen = await asA.connection().execute(async (c) => {
      await sql`SELECT set_config('cairn.tenant_id', 'tenant-b', false)`.execute(c);
      const rows = await sql<{ task_id: string }>`SELECT task_id FROM task_state ORDER BY task_id`.execute(c);
      const upd = await sql`UPDATE task_state SET updated_at = now() WHERE task_id = 'b-1'`.execute(c);
      return { ids: rows.rows.map((r) => r.task_id), updated: Number(upd.numAffectedRows) };
    });
    expect(seen).toEqual({ ids: ['a-1', 'a-2', 'a-3'], updated: 0 });
  });

  it("cannot plant rows under another tenant's task (audit, lease, checkpoint, receipt, annotation)", async () => {
    const refused = /another tenant|row-level security/;
    await expect(
      sql`INSERT INTO task_audit (task_id, version, prev_version, tenant_id, actor, patch)
          VALUES ('b-1', 2, 1, 'tenant-a', 'x', '[]')`.execute(asA),
    ).rejects.toThrow(refused);
    await expect(
      sql`INSERT INTO task_lease (task_id, branch, holder, lease_id, fencing_token, expires_at)
          VALUES ('b-2', 'main', 'thief', gen_random_uuid(), 99, now() + interval '1 hour')`.execute(asA),
    ).rejects.toThrow(refused);
    await expect(
      sql`INSERT INTO checkpoint (checkpoint_id, task_id, seq, state_version, schema_version, reason, doc, digest)
          VALUES (gen_random_uuid(), 'b-3', 2, 1, 'oaies.checkpoint.v2', 'x', '{}', 'x')`.execute(asA),
    ).rejects.toThrow(refused);
    await expect(
      sql`INSERT INTO task_annotation (annotation_id, task_id, author, body)
          VALUES (gen_random_uuid(), 'b-1', 'x', 'forged')`.execute(asA),
    ).rejects.toThrow(refused);
    // A receipt under B's idempotency key, keyed to A's own task, marked succeeded.
    const bKey = idempotencyKeyOf({ taskId: 'b-1', step: 'deploy', tool: 'deploy', args: { v: 1 } });
    await expect(
      sql`INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status, worker)
          VALUES (gen_random_uuid(), ${bKey}, 'a-1', 'deploy', 'deploy', 'x', 'succeeded', 'w')`.execute(asA),
    ).rejects.toThrow(/starts as started/);
    await sql`INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status, worker)
              VALUES (gen_random_uuid(), ${bKey}, 'a-1', 'deploy', 'deploy', 'x', 'started', 'w')`.execute(
      asA,
    );
    // A lease on a task id nobody has created yet (B's future task) is refused too.
    await expect(
      sql`INSERT INTO task_lease (task_id, branch, holder, lease_id, fencing_token, expires_at)
          VALUES ('b-future', 'main', 'thief', gen_random_uuid(), 1, now() + interval '1 hour')`.execute(asA),
    ).rejects.toThrow(refused);

    // B works as if nothing happened: its next version, its lease, its checkpoint, its effect.
    const storeB = createTaskStore({ db: asB, checkpointer: createCheckpointer({ db: asB }) });
    const r = await storeB.update({
      taskId: 'b-1',
      expectedVersion: 1,
      patch: { status: 'implementing', gates: { plan_approved: true } },
      actor: AGENT,
    });
    expect(r.ok).toBe(true);
    const lease = await createLeaseManager({ db: asB }).acquire({
      taskId: 'b-2',
      branch: 'main',
      agentId: 'b-worker',
      ttlMs: 30_000,
    });
    expect(lease.ok).toBe(true);
    const r3 = await storeB.update({
      taskId: 'b-3',
      expectedVersion: 1,
      patch: { status: 'implementing', gates: { plan_approved: true } },
      actor: AGENT,
      checkpoint: { reason: 'b checkpoints' },
    });
    expect(r3.ok).toBe(true);
    let ran = 0;
    const receipt = await createReceiptStore({ db: t.db }).runOnce({
      taskId: 'b-1',
      step: 'deploy',
      tool: 'deploy',
      args: { v: 1 },
      onUncertain: 'gate',
      effect: async () => {
        ran++;
        return 'ok';
      },
    });
    expect(receipt.status).toBe('succeeded');
    expect(ran).toBe(1);
    expect(await ownerCount(sql`SELECT count(*)::int AS n FROM task_annotation WHERE body = 'forged'`)).toBe(
      0,
    );
  });

  it('cannot override a guard with temporary tables (legal hold, quarantine, terminal state)', async () => {
    await sql`INSERT INTO legal_hold (hold_id, tenant_id, task_id, reason, placed_by)
              VALUES (gen_random_uuid(), 'tenant-a', 'a-2', 'litigation', 'legal')`.execute(t.db);
    await sql`INSERT INTO task_quarantine (task_id, reason, placed_by) VALUES ('a-3', 'failover', 'ops')`.execute(
      t.db,
    );
    await asA.connection().execute(async (c) => {
      await sql`CREATE TEMP TABLE legal_hold (LIKE cairn.legal_hold)`.execute(c);
      await sql`CREATE TEMP TABLE task_quarantine (LIKE cairn.task_quarantine)`.execute(c);
      await sql`CREATE TEMP TABLE task_status (status text, terminal boolean)`.execute(c);
      await sql`INSERT INTO task_status VALUES ('cancelled', false), ('planning', false)`.execute(c);
      await sql`CREATE TEMP TABLE task_transition (from_status text, to_status text)`.execute(c);
      await sql`INSERT INTO task_transition VALUES ('cancelled', 'planning')`.execute(c);
      await expect(sql`DELETE FROM task_state WHERE task_id = 'a-2'`.execute(c)).rejects.toThrow(
        /legal hold/,
      );
      await expect(
        sql`UPDATE task_state SET version = version + 1 WHERE task_id = 'a-3'`.execute(c),
      ).rejects.toThrow(/quarantined/);
      await sql`DROP TABLE pg_temp.legal_hold, pg_temp.task_quarantine, pg_temp.task_status, pg_temp.task_transition`.execute(
        c,
      );
    });
    const storeA = createTaskStore({ db: asA });
    const c = await storeA.update({
      taskId: 'a-1',
      expectedVersion: 1,
      patch: { status: 'cancelled' },
      actor: AGENT,
    });
    expect(c.ok).toBe(true);
    await asA.connection().execute(async (conn) => {
      await sql`CREATE TEMP TABLE task_status (status text, terminal boolean)`.execute(conn);
      await sql`INSERT INTO task_status VALUES ('cancelled', false), ('planning', false)`.execute(conn);
      await expect(
        sql`UPDATE task_state SET version = version + 1, status = 'planning' WHERE task_id = 'a-1'`.execute(
          conn,
        ),
      ).rejects.toThrow(/terminal/);
      await sql`DROP TABLE pg_temp.task_status`.execute(conn);
    });
    expect(await ownerCount(sql`SELECT count(*)::int AS n FROM task_state WHERE task_id = 'a-2'`)).toBe(1);
  });

  it("cannot create anything in Cairn's schema (a table or function shadowing one of Cairn's)", async () => {
    for (const ddl of [
      sql`CREATE TABLE cairn.task_status_override (status text)`,
      sql`CREATE FUNCTION cairn.cairn_current_tenant_x() RETURNS text LANGUAGE sql AS $$ SELECT 'tenant-b' $$`,
    ]) {
      await expect(ddl.execute(asA)).rejects.toThrow(/permission denied for schema cairn/);
    }
    // Its path starts with Cairn's schema, as on every connection Cairn makes.
    const path = await sql<{ p: string }>`SELECT current_setting('search_path') AS p`.execute(asA);
    expect(path.rows[0]!.p).toBe('cairn,public');
  });

  it('cannot raise a version without its audit row', async () => {
    await expect(
      sql`UPDATE task_state SET version = version + 1 WHERE task_id = 'a-2'`.execute(asA),
    ).rejects.toThrow(/without an audit row/);
    const v = await ownerCount(sql`SELECT version::int AS n FROM task_state WHERE task_id = 'a-2'`);
    expect(v).toBe(1);
  });

  it('cannot resolve its own human gate; an operator can', async () => {
    const id = await sql<{ id: string }>`
      INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status, worker)
      VALUES (gen_random_uuid(), 'gate-1', 'a-2', 'deploy', 'deploy', 'x', 'started', 'w') RETURNING receipt_id AS id`.execute(
      asA,
    );
    const receiptId = id.rows[0]!.id;
    await sql`UPDATE tool_receipt SET status = 'uncertain' WHERE receipt_id = ${receiptId}::uuid`.execute(
      asA,
    );
    await sql`UPDATE tool_receipt SET status = 'gated' WHERE receipt_id = ${receiptId}::uuid`.execute(asA);
    await expect(
      sql`UPDATE tool_receipt SET status = 'succeeded' WHERE receipt_id = ${receiptId}::uuid`.execute(asA),
    ).rejects.toThrow(/only an operator resolves it/);
    await expect(
      createReceiptStore({ db: asA }).resolveGate(receiptId, {
        outcome: 'succeeded',
        actor: OPERATOR,
        reason: 'checked',
      }),
    ).rejects.toThrow(/only an operator/);
    await createReceiptStore({ db: t.db }).resolveGate(receiptId, {
      outcome: 'compensated',
      actor: OPERATOR,
      reason: 'undone by hand',
    });
    expect(
      await ownerCount(
        sql`SELECT count(*)::int AS n FROM tool_receipt WHERE receipt_id = ${receiptId}::uuid AND status = 'compensated'`,
      ),
    ).toBe(1);
  });

  it("cannot speak as another tenant through headers, nor stamp another tenant's task on a message", async () => {
    const outbox = createOutbox();
    await expect(
      asA.transaction().execute((trx) =>
        outbox.enqueue(trx, [
          {
            topic: 'x',
            key: 'k',
            payload: {},
            headers: { 'cairn-tenant': 'tenant-b', 'Cairn-Task-Version': '99' },
          },
        ]),
      ),
    ).rejects.toThrow(/headers.cairn-tenant: is reserved.*headers.Cairn-Task-Version: is reserved/);
    await expect(
      sql`INSERT INTO outbox (lane, message_id, topic, key, headers, payload)
          VALUES (0, gen_random_uuid(), 'x', 'k', '{"cairn-tenant":"tenant-b"}', '\\x00')`.execute(asA),
    ).rejects.toThrow(/outbox_headers_ok/);
    await expect(
      sql`INSERT INTO outbox (lane, message_id, topic, key, payload, task_id, task_version)
          VALUES (0, gen_random_uuid(), 'x', 'b-1', '\\x00', 'b-1', 99)`.execute(asA),
    ).rejects.toThrow(/another tenant/);
    // What A may write lands as A's, whatever tenant it names.
    await expect(
      sql`INSERT INTO outbox (lane, message_id, tenant_id, topic, key, payload)
          VALUES (0, gen_random_uuid(), 'tenant-b', 'x', 'k', '\\x00')`.execute(asA),
    ).resolves.toBeDefined();
    expect(
      await ownerCount(
        sql`SELECT count(*)::int AS n FROM outbox WHERE tenant_id = 'tenant-b' AND topic = 'x'`,
      ),
    ).toBe(0);
  });

  it('two tenants using the same idempotency key get two message ids, and both are applied', async () => {
    const outbox = createOutbox();
    const [a] = outbox.prepare(
      [{ topic: 'invoices', key: 'inv', payload: {}, idempotencyKey: 'invoice-1' }],
      {
        tenantId: 'tenant-a',
      },
    );
    const [b] = outbox.prepare(
      [{ topic: 'invoices', key: 'inv', payload: {}, idempotencyKey: 'invoice-1' }],
      {
        tenantId: 'tenant-b',
      },
    );
    expect(a!.message_id).not.toBe(b!.message_id);
    // Even a forged equal id (hand-written SQL) is one per tenant in an inbox.
    const fresh = await t.db.transaction().execute((trx) =>
      insertInboxRows(trx, 'g', [
        { messageId: 'same', tenantId: 'tenant-a', topic: 'x', partition: 0, offset: '1', key: 'k' },
        { messageId: 'same', tenantId: 'tenant-b', topic: 'x', partition: 0, offset: '2', key: 'k' },
      ]),
    );
    expect(fresh.size).toBe(2);
  });

  it("one tenant's parked key does not park another tenant's key of the same name", async () => {
    const insert = (tenant: string) =>
      sql<{ id: number }>`
        INSERT INTO outbox (lane, message_id, tenant_id, topic, key, payload)
        VALUES (${laneOf('shared-key')}, gen_random_uuid(), ${tenant}, 'parked', 'shared-key', '\\x00')
        RETURNING id, message_id`.execute(t.db);
    const aRow = (await insert('tenant-a')).rows[0] as { id: number; message_id: string };
    const bRow = (await insert('tenant-b')).rows[0] as { id: number; message_id: string };
    await parkAsLaneOwner(t.db, {
      tenant: 'tenant-a',
      topic: 'parked',
      key: 'shared-key',
      messageId: aRow.message_id,
      id: aRow.id,
      error: 'refused',
    });
    const { rows: claimed } = await claimBatch(t.db, { lanes: [laneOf('shared-key')], limit: 100 });
    expect(claimed.filter((r) => r.topic === 'parked').map((r) => r.id)).toEqual([bRow.id]);
  });

  it('cannot re-point its own rows at another tenant after insert, nor write what consumers trust (review findings)', async () => {
    const denied = /permission denied|never change|violates check constraint/;
    // A lease of its own task, moved onto B's task.
    await sql`INSERT INTO task_lease (task_id, branch, holder, lease_id, fencing_token, expires_at)
              VALUES ('a-2', 'side', 'w', gen_random_uuid(), nextval('lease_token'), now() + interval '1 hour')`.execute(
      asA,
    );
    await expect(
      sql`UPDATE task_lease SET task_id = 'b-2' WHERE task_id = 'a-2'`.execute(asA),
    ).rejects.toThrow(denied);
    await expect(
      sql`UPDATE task_lease SET fencing_token = 0 WHERE task_id = 'a-2' AND branch = 'side'`.execute(asA),
    ).rejects.toThrow(/only grows/);
    // An outbox row of its own, re-pointed at B's task after the insert check.
    await expect(sql`UPDATE outbox SET task_id = 'b-1', task_version = 999`.execute(asA)).rejects.toThrow(
      denied,
    );
    // Rows consumers and operators trust: inbox, key versions, dead letters (replayed with their headers).
    await expect(
      sql`INSERT INTO inbox (consumer_group, message_id, topic, partition, "offset") VALUES ('billing', 'x', 't', 0, 0)`.execute(
        asA,
      ),
    ).rejects.toThrow(denied);
    await expect(
      sql`INSERT INTO inbox_key_version (consumer_group, key, version) VALUES ('billing', 'a-1', 99)`.execute(
        asA,
      ),
    ).rejects.toThrow(denied);
    await expect(
      sql`INSERT INTO inbox_dlq (consumer_group, message_id, topic, partition, "offset", headers, error, attempts)
          VALUES ('billing', 'x', 't', 0, 0, '{"cairn-tenant":"tenant-b"}', 'e', 1)`.execute(asA),
    ).rejects.toThrow(denied);
    // A document naming another tenant than its row.
    await expect(
      sql`UPDATE task_state SET version = version + 1, doc = jsonb_set(doc, '{tenant_id}', '"tenant-b"')
          WHERE task_id = 'a-2'`.execute(asA),
    ).rejects.toThrow(/task_state_doc_identity/);
    // The tenant list is the owner's; holds are answered for one's own tasks only.
    await expect(sql`SELECT tenant_id FROM tenant`.execute(asA)).rejects.toThrow(denied);
    await sql`INSERT INTO legal_hold (hold_id, tenant_id, task_id, reason, placed_by)
              VALUES (gen_random_uuid(), 'tenant-b', 'b-3', 'litigation', 'legal')`.execute(t.db);
    const held = await sql<{ h: boolean }>`SELECT cairn_is_held('tenant-b', 'b-3') AS h`.execute(asA);
    expect(held.rows[0]!.h).toBe(false);
    const lease = await createLeaseManager({ db: asB }).acquire({
      taskId: 'b-2',
      branch: 'side',
      agentId: 'b-worker',
      ttlMs: 30_000,
    });
    expect(lease.ok).toBe(true);
  });

  it("cannot make an operator's correction vanish by planting a row under its predictable id", async () => {
    const body = 'correction: the reviewer was bob';
    const id = uuidv5(`a-1\u0000${OPERATOR}\u0000${body}`, 'a4e2d3c1-6b5f-4f0e-9d8c-7b6a5e4d3c2b');
    await sql`INSERT INTO task_annotation (annotation_id, task_id, author, body)
              VALUES (${id}::uuid, 'a-1', ${OPERATOR}, 'nothing happened here')`.execute(asA);
    await expect(annotate(t.db, { taskId: 'a-1', author: OPERATOR, body })).rejects.toThrow(
      /already exists with another author or text/,
    );
  });

  it('a connection released in an aborted transaction leaks nothing to the application pool', async () => {
    await asA
      .connection()
      .execute(async (c) => {
        await sql`BEGIN`.execute(c);
        await sql`SELECT 1/0`.execute(c);
      })
      .catch(() => {});
    const seen = await sql<{ n: number }>`SELECT count(*)::int AS n FROM task_state`.execute(app);
    expect(seen.rows[0]!.n).toBe(0);
    const b = await sql<{ tenant_id: string }>`SELECT DISTINCT tenant_id FROM task_state`.execute(asB);
    expect(b.rows).toEqual([{ tenant_id: 'tenant-b' }]);
  });
});
