import { describe, expect, it } from 'vitest';
import { separateInFlight } from '../../scripts/chaos/settle.js';
import { verdict } from '../../scripts/demo/verify.js';

const check = (name: string, violations: number) => ({
  name,
  expected: '0',
  actual: String(violations),
  violations,
});

describe('soak: late work is not lost work, and lost work is never called late', () => {
  it('all settled: every check stands as the checker found it', () => {
    const checks = [check("group a: every transition's event applied", 2), check('no outbox row left', 1)];
    expect(separateInFlight(checks, { open: 0, outbox: 0, unobserved: 0 })).toEqual(checks);
  });

  it('at the deadline, only as many as were in flight are called late; the rest stay violations', () => {
    const [applied, outbox, twice] = separateInFlight(
      [
        check("group a: every transition's event applied", 7),
        check('no outbox row left', 3),
        check('group a: events applied once', 2),
      ],
      { open: 1, outbox: 1, unobserved: 2 },
    );
    expect(applied).toMatchObject({ violations: 5, notChecked: '2 still in flight at the settle deadline' });
    expect(verdict(applied!)).toBe('VIOLATION x5');
    expect(outbox).toMatchObject({ violations: 2, notChecked: '1 still in flight at the settle deadline' });
    expect(twice).toEqual(check('group a: events applied once', 2)); // a safety check is never relabelled
  });

  it('an open task alone relabels nothing', () => {
    const [applied] = separateInFlight([check("group b: every transition's event applied", 4)], {
      open: 1,
      outbox: 0,
      unobserved: 0,
    });
    expect(applied).toEqual(check("group b: every transition's event applied", 4));
  });
});
