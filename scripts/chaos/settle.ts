import { sql } from 'kysely';
import type { Db } from '../../src/db/database.js';
import type { Check } from '../demo/verify.js';

/** What the settle phase last saw unfinished (-1: Postgres did not answer). */
export interface InFlight {
  open: number;
  outbox: number;
  unobserved: number;
}

/** Liveness: everything in flight (tasks, outbox rows, events to apply) finished in the settle phase. */
export function livenessCheck(w: InFlight): Check {
  const unknown = w.open < 0;
  return {
    name: 'all work finished in the settle phase',
    expected: '0 in flight',
    actual: unknown
      ? 'unknown: Postgres did not answer'
      : `${w.open} open, ${w.outbox} outbox, ${w.unobserved} unapplied`,
    violations: unknown ? 1 : w.open + w.outbox + w.unobserved,
  };
}

/**
 * When the settle deadline passed with work in flight, a message still in the outbox or not
 * yet applied is late, not lost: the checks that count undelivered work say so, up to what the
 * settle phase last saw in flight (the liveness check fails the run), instead of reporting a
 * safety violation. A message lost outright is the checker's "every transition published or
 * still in the outbox"; every other check (applied twice, order, stale writes, leases) stands.
 */
export function separateInFlight(checks: Check[], w: InFlight): Check[] {
  const inFlightFor = (name: string) =>
    name === 'no outbox row left'
      ? w.outbox
      : /every transition's event applied$/.test(name)
        ? w.unobserved
        : 0;
  return checks.map((c) => {
    const late = Math.min(c.violations, Math.max(0, inFlightFor(c.name)));
    return late === 0
      ? c
      : {
          ...c,
          violations: c.violations - late,
          notChecked: `${late} still in flight at the settle deadline`,
        };
  });
}

/**
 * The settle phase: no faults, until nothing is in flight (open tasks, outbox rows, events a
 * group has not applied) or work stalls. The deadline is for a stall: while work moves (a
 * transition, an event applied, an outbox row published: counts that only grow) a busy machine
 * is slow, not stuck, and the deadline moves on, up to four settle periods in all.
 */
export async function settle(
  db: Db,
  groups: readonly string[],
  settleS: number,
  o: { log: (line: string) => void; tick: () => Promise<void> },
): Promise<InFlight> {
  const settleCap = Date.now() + 4 * settleS * 1000;
  let settleUntil = Date.now() + settleS * 1000;
  let done = -1;
  let inFlight: InFlight = { open: -1, outbox: -1, unobserved: -1 };
  for (;;) {
    const s = await sql<InFlight & { done: number }>`
      SELECT (SELECT count(*) FROM task_state WHERE status NOT IN ('complete','failed','cancelled','expired'))::int AS open,
             (SELECT count(*) FROM outbox)::int AS outbox,
             (SELECT count(*) FROM task_audit a, unnest(${groups}::text[]) g
               WHERE a.actor LIKE '%/agents/%' AND NOT EXISTS (SELECT 1 FROM chaos_observed o
                 WHERE o.consumer_group = g AND o.key = a.task_id AND o.version = a.version))::int AS unobserved,
             ((SELECT count(*) FROM task_audit) + (SELECT count(*) FROM chaos_observed)
               + coalesce(pg_sequence_last_value(pg_get_serial_sequence('outbox', 'id')), 0)
               - (SELECT count(*) FROM outbox))::int AS done`
      .execute(db)
      .catch(() => null);
    const r = s?.rows[0];
    if (r) {
      inFlight = { open: r.open, outbox: r.outbox, unobserved: r.unobserved };
      if (r.open === 0 && r.outbox === 0 && r.unobserved === 0) return inFlight;
      if (r.done > done) {
        done = r.done;
        settleUntil = Math.min(settleCap, Date.now() + settleS * 1000);
      }
    }
    if (Date.now() > settleUntil) {
      o.log(
        `[chaos] settle timed out: ${inFlight.open} open tasks, ${inFlight.outbox} outbox rows, ${inFlight.unobserved} events unobserved`,
      );
      return inFlight;
    }
    await o.tick();
    await new Promise((r) => setTimeout(r, 500));
  }
}
