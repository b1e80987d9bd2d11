import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { LeaseLostError, ValidationError } from '../../src/errors.js';
import { createLeaseManager } from '../../src/leases/leases.js';
import { createOutbox } from '../../src/outbox/outbox.js';
import { createReceiptStore, createReceiptStoreWithTestHooks } from '../../src/receipts/receipts.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { AGENT, newTask } from '../state/fixtures.js';
import { callSink, type Sink, startSink } from '../support/effectSink.js';
import { waitForDbClockPast, waitForLeaseExpiry } from '../support/leases.js';
import { createTestDatabase, type TestDatabase } from '../support/testDatabase.js';

let tdb: TestDatabase;
let sink: Sink;
beforeAll(async () => {
  tdb = await createTestDatabase('leases_receipts', { max: 24 });
  sink = await startSink();
});
afterAll(async () => {
  await sink.close();
  await tdb.drop();
});

/** How long the simulated effect takes: it holds the race window open for the other workers. */
const effectTakes = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('leases with fencing tokens', () => {
  it('expiry and take-over: the old holder’s write with its stale token is refused, the new holder’s succeeds, tokens only grow', async () => {
    const leases = createLeaseManager({ db: tdb.db });
    const store = createTaskStore({ db: tdb.db });
    await store.create({ task: newTask('lease-1'), actor: AGENT });
    const a = await leases.acquire({
      taskId: 'lease-1',
      branch: 'main',
      agentId: 'agent-a',
      ttlMs: 500,
    });
    expect(a.ok).toBe(true);
    if (!a.ok) return;
    const early = await leases.acquire({
      taskId: 'lease-1',
      branch: 'main',
      agentId: 'agent-b',
      ttlMs: 5000,
    });
    expect(early).toMatchObject({ ok: false, holder: 'agent-a' });
    await waitForLeaseExpiry(tdb.db, 'lease-1', 'main');
    const b = await leases.acquire({ taskId: 'lease-1', branch: 'main', agentId: 'agent-b', ttlMs: 5000 });
    expect(b.ok).toBe(true);
    if (!b.ok) return;
    // Tokens come from one sequence (migration 0016): greater, not necessarily by one.
    expect(b.fencingToken).toBeGreaterThan(a.fencingToken);

    await expect(
      store.update({
        taskId: 'lease-1',
        expectedVersion: 1,
        patch: { active_agents: ['a'] },
        actor: AGENT,
        lease: a,
      }),
    ).rejects.toThrow(LeaseLostError);
    expect((await store.get('lease-1'))?.version).toBe(1);
    const outbox = createOutbox();
    await expect(
      tdb.db
        .transaction()
        .execute((t) => outbox.enqueue(t, [{ topic: 'fenced', key: 'lease-1', payload: {} }], { lease: a })),
    ).rejects.toThrow(/fencing token 1 is no longer current; nothing was enqueued/);
    expect(await tdb.db.selectFrom('outbox').select('id').execute()).toEqual([]);
    expect(await leases.renew(a, 5000)).toEqual({ ok: false, reason: 'lease_lost' });
    const ok = await store.update({
      taskId: 'lease-1',
      expectedVersion: 1,
      patch: { active_agents: ['b'] },
      actor: AGENT,
      lease: b,
    });
    expect(ok.ok).toBe(true);

    await leases.release(b);
    const c = await leases.acquire({ taskId: 'lease-1', branch: 'main', agentId: 'agent-c', ttlMs: 5000 });
    expect(c.ok && c.fencingToken).toBeGreaterThan(b.fencingToken);
  });

  it('an agent whose clock is 10 minutes off can neither steal a held lease nor keep an expired one', async () => {
    const leases = createLeaseManager({ db: tdb.db });
    const store = createTaskStore({ db: tdb.db });
    await store.create({ task: newTask('skew'), actor: AGENT });
    const holder = await leases.acquire({
      taskId: 'skew',
      branch: 'main',
      agentId: 'honest',
      ttlMs: 30_000,
    });
    expect(holder.ok).toBe(true);
    vi.useFakeTimers({ toFake: ['Date'] });
    try {
      vi.setSystemTime(Date.now() + 10 * 60_000); // this process now believes it is 10 minutes later
      const thief = await leases.acquire({
        taskId: 'skew',
        branch: 'main',
        agentId: 'fast-clock',
        ttlMs: 30_000,
      });
      expect(thief).toMatchObject({ ok: false, holder: 'honest' });

      vi.setSystemTime(Date.now() - 20 * 60_000); // now 10 minutes behind
      const slow = await leases.acquire({
        taskId: 'skew',
        branch: 'slow',
        agentId: 'slow-clock',
        ttlMs: 300,
      });
      if (!slow.ok) throw new Error('expected the lease');
      await waitForLeaseExpiry(tdb.db, 'skew', 'slow');
      // By its own clock the lease has ~10 minutes left; by the database's it expired.
      expect(slow.expiresAt.getTime()).toBeGreaterThan(Date.now());
      expect(await leases.renew(slow, 30_000)).toEqual({ ok: false, reason: 'lease_lost' });
      await expect(
        store.update({
          taskId: 'skew',
          expectedVersion: 1,
          patch: { active_agents: ['slow'] },
          actor: AGENT,
          lease: slow,
        }),
      ).rejects.toThrow(LeaseLostError);
    } finally {
      vi.useRealTimers();
    }
  });

  it('withLease renews in the background, and aborts the work when the lease is lost', async () => {
    const leases = createLeaseManager({ db: tdb.db });
    const kept = await leases.withLease(
      { taskId: 'wl', branch: 'main', agentId: 'w', ttlMs: 300 },
      async (lease) => {
        // Well past three TTLs after the first expiry (database clock): only renewals keep it.
        await waitForDbClockPast(tdb.db, lease.expiresAt, 900);
        return (await leases.renew(lease, 300)).ok;
      },
    );
    expect(kept).toBe(true);
    const lost = await leases.withLease(
      { taskId: 'wl', branch: 'main', agentId: 'w', ttlMs: 300 },
      async (_lease, signal) => {
        // Someone breaks the lease behind our back (an operator, or a long GC pause past the TTL).
        await tdb.db
          .updateTable('task_lease')
          .set({ expires_at: new Date(0) })
          .where('task_id', '=', 'wl')
          .execute();
        await new Promise<void>((resolve) => signal.addEventListener('abort', () => resolve()));
        return signal.reason;
      },
    );
    expect(lost).toBeInstanceOf(LeaseLostError);
  });
});

describe('tool receipts', () => {
  it('a second call with the same key returns the recorded result without running the effect', async () => {
    const receipts = createReceiptStore({ db: tdb.db });
    let runs = 0;
    const call = () =>
      receipts.runOnce({
        taskId: 'r-1',
        step: 'deploy',
        tool: 'deployer',
        args: { env: 'prod', version: '1.2.3' },
        onUncertain: 'gate',
        effect: async ({ idempotencyKey }) => {
          runs++;
          return callSink(sink.url, '/apply', 'r-1', idempotencyKey);
        },
      });
    const first = await call();
    const second = await call();
    expect(first).toMatchObject({ status: 'succeeded', ran: true });
    expect(second).toMatchObject({ status: 'succeeded', ran: false, result: { deployed: 'r-1' } });
    expect(runs).toBe(1);
    expect(first.idempotencyKey).toMatch(/^sha256:[0-9a-f]{64}$/);
    // Argument order does not change the key (canonical JSON).
    const again = await receipts.runOnce({
      taskId: 'r-1',
      step: 'deploy',
      tool: 'deployer',
      args: { version: '1.2.3', env: 'prod' },
      onUncertain: 'gate',
      effect: async () => {
        runs++;
      },
    });
    expect(again.receiptId).toBe(first.receiptId);
    expect(runs).toBe(1);
    expect((await receipts.byTask('r-1')).map((r) => r.status)).toEqual(['succeeded']);
  });

  it('10 workers racing for the same lease and the same receipt key: one effect', async () => {
    const leases = createLeaseManager({ db: tdb.db });
    const receipts = createReceiptStore({ db: tdb.db });
    let effects = 0;
    const outcomes = await Promise.all(
      Array.from({ length: 10 }, (_, w) =>
        leases
          .withLease({ taskId: 'race', branch: 'deploy', agentId: `w${w}`, ttlMs: 5000 }, (lease) =>
            receipts.runOnce({
              taskId: 'race',
              step: 'deploy',
              tool: 'deployer',
              args: {},
              lease,
              onUncertain: 'gate',
              effect: async ({ idempotencyKey }) => {
                effects++;
                await effectTakes(50);
                return callSink(sink.url, '/apply', 'race', idempotencyKey);
              },
            }),
          )
          .then(
            (r) => r.status,
            (e: Error) => e.name,
          ),
      ),
    );
    expect(effects).toBe(1);
    // Most lose the lease race; one that comes after the winner released it finds the
    // receipt succeeded and does not run the effect (seen under load): both are right.
    expect(outcomes.filter((o) => o !== 'succeeded' && o !== 'LeaseHeldError')).toEqual([]);
    expect(outcomes.filter((o) => o === 'LeaseHeldError').length).toBeGreaterThanOrEqual(1);
    // And without a lease, ten concurrent calls on one key still run the effect once.
    const bare = await Promise.all(
      Array.from({ length: 10 }, () =>
        receipts.runOnce({
          taskId: 'race',
          step: 'notify',
          tool: 'mailer',
          args: {},
          onUncertain: 'gate',
          effect: async () => {
            effects++;
            await effectTakes(50);
            return 'sent';
          },
        }),
      ),
    );
    expect(effects).toBe(2);
    // One ran it; each other call found it running, or (on a busy machine, after the winner
    // finished) found it succeeded without running it: the invariant is one effect.
    expect(bare.filter((r) => r.status === 'succeeded' && r.ran)).toHaveLength(1);
    expect(bare.filter((r) => r.status !== 'in_progress' && r.status !== 'succeeded')).toEqual([]);
  });

  it('a receipt left started by a dead worker is uncertain: compensated, gated (recorded in TaskState), or retried only for idempotent tools', async () => {
    const leases = createLeaseManager({ db: tdb.db });
    const store = createTaskStore({ db: tdb.db });
    await store.create({ task: newTask('unc'), actor: AGENT });
    // A worker that dies after writing its intent: its lease expires, the receipt stays `started`.
    const dying = createReceiptStoreWithTestHooks(
      {
        db: tdb.db,
      },
      {
        afterIntent: () => {
          throw new Error('worker died');
        },
      },
    );
    const dieAt = async (step: string) => {
      const lease = await leases.acquire({ taskId: 'unc', branch: step, agentId: 'doomed', ttlMs: 200 });
      if (!lease.ok) throw new Error('lease');
      await expect(
        dying.runOnce({
          taskId: 'unc',
          step,
          tool: 'deployer',
          args: {},
          lease,
          onUncertain: 'gate',
          effect: async () => 'x',
        }),
      ).rejects.toThrow('worker died');
    };
    for (const step of ['s-comp', 's-gate', 's-retry']) await dieAt(step);
    for (const step of ['s-comp', 's-gate', 's-retry']) await waitForLeaseExpiry(tdb.db, 'unc', step);

    const receipts = createReceiptStore({ db: tdb.db });
    let effects = 0;
    const effect = async () => {
      effects++;
      return 'done';
    };
    const comp = await receipts.runOnce({
      taskId: 'unc',
      step: 's-comp',
      tool: 'deployer',
      args: {},
      onUncertain: 'compensate',
      compensate: async ({ idempotencyKey }) => callSink(sink.url, '/compensate', 'unc', idempotencyKey),
      effect,
    });
    expect(comp.status).toBe('compensated');
    expect(sink.compensated.has(comp.idempotencyKey)).toBe(true);

    const gate = await receipts.runOnce({
      taskId: 'unc',
      step: 's-gate',
      tool: 'deployer',
      args: {},
      onUncertain: 'gate',
      gate: { store, actor: 'spiffe://acme.example/cairn/receipts' },
      effect,
    });
    expect(gate.status).toBe('gated');
    const audit = await store.history('unc');
    expect(audit.at(-1)?.reason).toMatch(
      /^human decision required: receipt .* \(deployer at s-gate\) is uncertain/,
    );

    await expect(
      receipts.runOnce({
        taskId: 'unc',
        step: 's-retry',
        tool: 'deployer',
        args: {},
        onUncertain: 'retry',
        effect,
      }),
    ).rejects.toThrow(ValidationError);
    const retried = await receipts.runOnce({
      taskId: 'unc',
      step: 's-retry',
      tool: 'deployer',
      args: {},
      onUncertain: 'retry',
      idempotentTool: true,
      effect,
    });
    expect(retried).toMatchObject({ status: 'succeeded', ran: true });
    expect(effects).toBe(1); // only the idempotent retry ran an effect

    await receipts.resolveGate(gate.receiptId, {
      outcome: 'succeeded',
      actor: 'ops@acme',
      reason: 'checked the deploy log',
    });
    expect((await receipts.byKey(gate.idempotencyKey))?.status).toBe('succeeded');
  });
});
