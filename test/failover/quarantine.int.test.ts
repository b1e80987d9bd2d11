import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createReceiptStore } from '../../src/receipts/receipts.js';
import { quarantine, releaseQuarantine } from '../../src/recovery/failover.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let t: TestDatabase;
beforeAll(async () => {
  t = await createTestDatabase('quarantine');
});
afterAll(async () => {
  await t?.drop();
});

describe('quarantine after a failover', () => {
  it('a quarantined task takes no transition and starts no effect until released', async () => {
    const store = createTaskStore({ db: t.db, cacheSize: 0 });
    const receipts = createReceiptStore({ db: t.db });
    await store.create({ task: newTask('q-1'), actor: AGENT });
    expect(await quarantine(t.db, ['q-1'], { reason: 'failover: lost v2', actor: AGENT })).toBe(1);
    expect(await quarantine(t.db, ['q-1'], { reason: 'again', actor: AGENT })).toBe(0); // one active at a time

    await expect(
      store.update({ taskId: 'q-1', expectedVersion: 1, patch: { status: 'implementing' }, actor: AGENT }),
    ).rejects.toMatchObject({ code: 'quarantined', retriable: false });
    let ran = 0;
    await expect(
      receipts.runOnce({
        taskId: 'q-1',
        step: 'deploy',
        tool: 'deployer',
        args: {},
        onUncertain: 'gate',
        effect: async () => {
          ran++;
        },
      }),
    ).rejects.toThrow(/task q-1 is quarantined after a failover: INSERT on tool_receipt refused/);
    expect(ran).toBe(0);
    expect((await store.get('q-1'))?.version).toBe(1);

    expect(await releaseQuarantine(t.db, 'q-1', AGENT)).toBe(1);
    const r = await store.update({
      taskId: 'q-1',
      expectedVersion: 1,
      patch: { status: 'implementing' },
      actor: AGENT,
    });
    expect(r.ok).toBe(true);
  });
});
