import { describe, expect, it } from 'vitest';
import { cpuLine, cpuPerMsg, parseStatCpuS } from '../../bench/cpu.js';

/** A /proc/<pid>/stat line: pid, (comm), then fields from state on; utime and stime are 14 and 15. */
const stat = (comm: string, utime: number, stime: number) =>
  `4242 (${comm}) S 1 4242 4242 0 -1 4194560 1234 0 0 0 ${utime} ${stime} 0 0 20 0 3 0 987654 123456789 4321 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n`;

describe('parseStatCpuS', () => {
  it('adds utime and stime, in USER_HZ ticks (100 a second)', () => {
    expect(parseStatCpuS(stat('postgres', 250, 50))).toBe(3);
  });

  it("counts fields from the LAST ')' when the command name holds spaces and ')'", () => {
    // A process may name itself anything: 'a) S 1 2 3' would shift every field if the
    // parser stopped at the first ')'.
    expect(parseStatCpuS(stat('evil) S 1 2 3 4 5 6 7 8 9 10 11 12', 700, 300))).toBe(10);
    expect(parseStatCpuS(stat('postgres: cairn bench (idle)', 12, 8))).toBe(0.2);
    expect(parseStatCpuS(stat(')', 1, 2))).toBe(0.03);
  });

  it('returns undefined for a line without the fields, not 0', () => {
    expect(parseStatCpuS('')).toBeUndefined();
    expect(parseStatCpuS('4242 (java) S 1 2')).toBeUndefined();
    expect(parseStatCpuS('4242 java S 1 2 3 4 5 6 7 8 9 10 11 12 13')).toBeUndefined();
  });
});

describe('cpuPerMsg', () => {
  it('gives µs per message per process, and null for a broker that was not measured', () => {
    const c = cpuPerMsg({ nodeS: 1, postgresS: 0.5, brokerS: null }, 100_000);
    expect(c).toEqual({
      messages: 100_000,
      cpu_us_per_msg: 15,
      cpu_us_per_msg_by_process: { node: 10, postgres: 5, broker: null },
    });
    expect(cpuLine(c)).toBe(
      'CPU µs/msg: total 15 without the broker (Node 10, Postgres 5, broker not measured)',
    );
  });

  it('leaves Postgres out of the total, and says so, when its backends are not local processes', () => {
    const c = cpuPerMsg({ nodeS: 1, postgresS: null, brokerS: null }, 1000);
    expect(c.cpu_us_per_msg).toBe(1000);
    expect(c.cpu_us_per_msg_by_process).toEqual({ node: 1000, postgres: null, broker: null });
    expect(cpuLine(c, 'op')).toBe(
      'CPU µs/op: total 1000 without Postgres and the broker (Node 1000, Postgres not measured, broker not measured)',
    );
  });

  it('keeps a measured 0 as 0 (a phase that used no Postgres)', () => {
    const c = cpuPerMsg({ nodeS: 2, postgresS: 0, brokerS: 1 }, 1000);
    expect(c.cpu_us_per_msg_by_process).toEqual({ node: 2000, postgres: 0, broker: 1000 });
    expect(cpuLine(c)).toBe('CPU µs/msg: total 3000 (Node 2000, Postgres 0, broker 1000)');
  });
});
