import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Db } from '../../src/db/database.js';
import { laneOf } from '../../src/outbox/lanes.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { twoTenants } from '../support/tenants.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

/**
 * Values a tenant's own SQL writes are read whole by processes every tenant shares: the relay
 * (outbox headers and keys), retention (task documents), the console (receipt errors and
 * resolutions). Stored compressed, a value of 90 million chr(1) takes 1 MB on disk and renders
 * as 540 MB of text: past V8's longest string, node-postgres threw in its socket handler and
 * the process died (the relay for every lane, retention for every tenant, the console's page).
 * A key past 2,600 bytes could not be parked (a btree row) and stopped the relay's loop.
 * Migration 0017 bounds each value where it is written.
 */
let t: TestDatabase;
let app: Db;
let asA: Db;

beforeAll(async () => {
  t = await createTestDatabase('value_sizes');
  ({ app, asA } = await twoTenants(t, 2));
  await createTaskStore({ db: asA }).create({
    task: newTask('a-1', { tenant_id: 'tenant-a' }),
    actor: AGENT,
  });
});
afterAll(async () => {
  await app?.destroy();
  await t?.drop();
});

const refused = (q: { execute(db: Db): Promise<unknown> }) =>
  q.execute(asA).then(
    () => 'written',
    (e: Error) => e.message,
  );

describe("a tenant's own values, bounded where shared processes read them", () => {
  it('outbox: headers past 16 KiB, a key past 2 KiB, a topic Kafka cannot take are refused; what the library writes is not', async () => {
    const row = (topic: string, key: string, headers: unknown) =>
      sql`INSERT INTO outbox (lane, message_id, topic, key, headers, payload)
          VALUES (${laneOf(key)}, gen_random_uuid(), ${topic}, ${key}, ${JSON.stringify(headers)}::jsonb, '\\x00')`;
    expect({
      headers: await refused(row('orders', 'k', { h: '\u0001'.repeat(1_000_000) })),
      key: await refused(row('orders', 'k'.repeat(2600), {})),
      topic: await refused(row('x'.repeat(3200), 'k', {})),
      fine: await refused(row('orders', 'k'.repeat(1024), { h: 'v'.repeat(8192) })),
    }).toEqual({
      headers: expect.stringMatching(/outbox_headers_size/),
      key: expect.stringMatching(/outbox_key_size/),
      topic: expect.stringMatching(/outbox_topic_name/),
      fine: 'written',
    });
  });

  it('a task document, an audit reason and a receipt error of hundreds of megabytes (rendered) are refused', async () => {
    const huge = '\u0001'.repeat(40_000_000); // 40 MB as stored, 240 MB as text
    expect({
      doc: await refused(
        sql`UPDATE task_state SET version = version + 1,
                   doc = jsonb_set(jsonb_set(doc, '{context_summary}', to_jsonb(${huge}::text)), '{version}', to_jsonb(version + 1))
             WHERE task_id = 'a-1'`,
      ),
      reason: await refused(sql`UPDATE task_audit SET reason = repeat('x', 2000000) WHERE task_id = 'a-1'`),
      error: await refused(
        sql`INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, step, tool, args_digest, status, worker, error)
            VALUES (gen_random_uuid(), 'a-1/x', 'a-1', 'x', 'x', 'x', 'started', 'w', repeat('e', 2000000))`,
      ),
    }).toEqual({
      doc: expect.stringMatching(/task_state_doc_size/),
      reason: expect.stringMatching(/task_audit_patch_size|permission denied|never change/),
      error: expect.stringMatching(/tool_receipt_text_size/),
    });
  });
});
