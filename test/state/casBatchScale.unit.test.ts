// The coalescer (src/state/sql/casBatch.ts) is shared by every tenant of a Db: its cost per
// update must not grow with the number waiting (review finding: it grew with the square of it).
import { describe, expect, it } from 'vitest';
import { coalescedCas } from '../../src/state/sql/casBatch.js';

/** An Executor whose every batch statement answers after 1 ms: all rows locked and swapped. */
function fakeDb() {
  return {
    isTransaction: false,
    async executeQuery(q: { parameters: readonly unknown[] }) {
      const ids = (JSON.parse(q.parameters[0] as string) as { task_id: string }[]).map((i) => i.task_id);
      await new Promise((r) => setTimeout(r, 1));
      return { rows: [{ locked: ids, swapped: ids }] };
    },
  } as never;
}

async function perUpdateMicros(n: number): Promise<number> {
  const db = fakeDb();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: n }, (_, i) =>
      coalescedCas(
        db,
        {
          taskId: `t-${i}`,
          tenantId: i % 2 ? 'acme' : 'globex',
          expectedVersion: 1,
          expectedUpdatedAt: 'x',
          status: 'planning',
          schemaVersion: 'v2',
          doc: {},
          audit: { actor: 'a', reason: null, patch: [] },
        },
        async () => true,
      ),
    ),
  );
  return ((performance.now() - t0) * 1000) / n;
}

describe('the coalescer with many waiting updates', () => {
  it('costs about the same per update with 40,000 waiting as with 5,000', async () => {
    const small = await perUpdateMicros(5_000);
    const large = await perUpdateMicros(40_000);
    console.log(`per update: ${small.toFixed(0)} µs at 5,000 waiting, ${large.toFixed(0)} µs at 40,000`);
    expect(large / small).toBeLessThan(3);
  }, 120_000);
});
