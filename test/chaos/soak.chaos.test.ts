import { randomBytes } from 'node:crypto';
import { describe, expect, inject, it } from 'vitest';
import { runSoak } from '../../scripts/chaos/soak.js';
import { dropScratchDatabase } from '../../scripts/lib/scratchDatabase.js';

describe('chaos soak (short: one minute of faults)', () => {
  it('every kind of fault is injected and the independent checker finds 0 violations', async () => {
    const database = `cairn_t_chaos_${randomBytes(4).toString('hex')}`;
    try {
      const r = await runSoak({
        minutes: 1,
        seed: 7,
        rate: 1,
        workMs: 150,
        settleS: 120,
        faultEveryMs: 1000,
        brokerRestartEveryS: 25,
        databaseUrl: inject('databaseUrl'),
        database,
        kafkaBrokers: inject('kafkaBrokers'),
        canRestartBroker: inject('kafkaLocal'),
        log: (line) => process.stderr.write(`${line}\n`),
      });
      // A check that could not run (the broker did not answer the checker) proves nothing: it fails too.
      expect(r.checks.filter((c) => c.violations > 0 || c.notChecked)).toEqual([]);
      expect(r.tasks).toBeGreaterThan(0); // how many fit in a minute depends on the machine
      expect(r.terminal).toBe(r.tasks);
      for (const [kind, n] of Object.entries(r.faults)) {
        if (kind !== 'broker_restart' || inject('kafkaLocal')) expect(n, kind).toBeGreaterThan(0);
      }
    } finally {
      await dropScratchDatabase(inject('databaseUrl'), database);
    }
  }, 900_000); // a deadline, not a measure: on a busy machine the settle phase waits while work shrinks
});
