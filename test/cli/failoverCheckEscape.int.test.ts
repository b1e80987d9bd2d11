import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { failoverCommand } from '../../cli/failover.js';
import { createRelay } from '../../relay/relay.js';
import type { Db } from '../../src/db/database.js';
import { createKafkaPublisher } from '../../src/kafka/publisher.js';
import { twoTenants } from '../support/tenants.js';
import {
  createTestDatabase,
  createTestTopic,
  kafkaBrokers,
  type TestDatabase,
} from '../support/testDatabase.js';
import { waitFor } from '../support/topicReader.js';

let tdb: TestDatabase;
let topic: string;
let app: Db;
let asA: Db;

beforeAll(async () => {
  tdb = await createTestDatabase('failover_check_escape');
  topic = await createTestTopic('failover-check-escape', 1);
  ({ app, asA } = await twoTenants(tdb, 2));
});
afterAll(async () => {
  await app?.destroy();
  await tdb?.drop();
});

/**
 * Review: a task id is a tenant's to choose (its own SQL). `cairn failover check` printed the
 * diverged ones raw on its last line: an id with control characters erased the line, printed
 * "nothing lost" in its place and wrote the operator's clipboard (OSC 52).
 */
describe('cairn failover check prints diverged task ids', () => {
  it('escaped, like every other line', async () => {
    const evil =
      'a-1\u001b[2K\rnothing lost: the database has everything the broker saw\u001b]52;c;ZWNobyBwd25lZA==\u0007';
    // Tenant A's own SQL: a task of its own under that id, and a message claiming version 99 of it.
    await sql`INSERT INTO task_state (task_id, tenant_id, version, schema_version, status, doc)
              VALUES (${evil}, 'tenant-a', 1, 'x', 'planning', ${JSON.stringify({ task_id: evil })}::jsonb)`.execute(
      asA,
    );
    await sql`INSERT INTO outbox (lane, message_id, task_id, task_version, task_seq, topic, key, payload)
              VALUES (3, gen_random_uuid(), ${evil}, 99, 0, ${topic}, 'k', '\\x00')`.execute(asA);
    const relay = createRelay({
      db: tdb.db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokers() }),
      instanceId: 'r1',
    });
    const run = relay.run();
    await waitFor(
      'published',
      async () => (await tdb.db.selectFrom('outbox').select('id').execute()).length === 0,
      30_000,
    );
    await relay.stop();
    await run;
    const env = { DATABASE_URL: process.env.DATABASE_URL, KAFKA_BROKERS: process.env.KAFKA_BROKERS };
    process.env.DATABASE_URL = tdb.url;
    process.env.KAFKA_BROKERS = kafkaBrokers().join(',');
    const out: string[] = [];
    const spy = vi.spyOn(console, 'log').mockImplementation((...a: unknown[]) => void out.push(a.join(' ')));
    let code: number;
    try {
      code = await failoverCommand(['check', '--topics', topic]);
    } finally {
      spy.mockRestore();
      Object.assign(process.env, env);
      for (const [k, v] of Object.entries(env)) if (v === undefined) delete process.env[k];
    }
    expect(code).toBe(1);
    expect(out.join('\n')).toContain('hold these tasks (--hold): a-1');
    expect(out.join('\n')).not.toContain('\u001b');
  }, 120_000);
});
