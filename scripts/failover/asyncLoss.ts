import { sql } from 'kysely';
import type { Db } from '../../src/db/database.js';
import { ROLES, type Role } from '../demo/workflow.js';
import type { Child } from '../lib/spawnTs.js';
import { type PgServer, partition } from './pgCluster.js';
import type { WaitUntil } from './waitUntil.js';

export interface AsyncLoss {
  /** The agent that worked on alone after the cut: only tasks of its stage can be lost. */
  woken: Role;
  /** Open tasks per stage when the agents were frozen. */
  openByStage: Record<string, number>;
}

/**
 * Cuts region B off while region A goes on alone, so that what is lost is a known mix. All
 * agents are frozen (SIGSTOP) first, region B replays everything region A committed, and is
 * cut off; the witness writes on, then one agent (of the stage holding the most open tasks)
 * is woken until it commits a transition, and the relay publishes past it. The tasks of the
 * other stages are then exactly as region B holds them: some tasks are lost and held, the
 * rest resume. With every agent running after the cut, a few chunked commits touched every
 * task on a busy machine (13 of 13 tasks held, twice in five runs under two CPU hogs): region
 * B had nothing left to resume and its first transition never came.
 */
export async function cutOffRegionA(o: {
  a: PgServer;
  b: PgServer;
  dbA: Db;
  agents: ReadonlyMap<Role, Child>;
  witnessWrites: () => number;
  demoProgress: () => Promise<number>;
  waitUntil: WaitUntil;
  timeoutMs: number;
  log: (line: string) => void;
  /** Runs on region A once region B is cut off (what it does there never reaches B). */
  afterCut?: () => Promise<void>;
}): Promise<AsyncLoss> {
  const agents = [...o.agents.values()];
  const signal = (cs: readonly Child[], s: NodeJS.Signals) => {
    for (const c of cs) if (c.proc.exitCode === null && c.proc.signalCode === null) c.proc.kill(s);
  };
  // Frozen with open tasks in two stages at least: one stage to lose, one to resume.
  let openByStage: Record<string, number> = {};
  const until = Date.now() + o.timeoutMs;
  for (;;) {
    signal(agents, 'SIGSTOP');
    const rows = await sql<{ status: string; n: number }>`
      SELECT status, count(*)::int AS n FROM task_state
       WHERE task_id LIKE 'demo-%' AND status IN (${sql.join(Object.values(ROLES).map((r) => r.from))})
       GROUP BY status`.execute(o.dbA);
    openByStage = Object.fromEntries(rows.rows.map((r) => [r.status, r.n]));
    if (rows.rows.length >= 2) break;
    if (Date.now() > until) throw new Error('failover: open tasks never stood in two stages at once');
    signal(agents, 'SIGCONT');
    await new Promise((r) => setTimeout(r, 200));
  }
  const [lsn] = await o.a.query<{ lsn: string }>('SELECT pg_current_wal_lsn()::text AS lsn');
  await o.waitUntil(
    'region B to replay what region A committed before its agents froze',
    async () =>
      (
        await o.a.query<{ ok: boolean }>(
          `SELECT replay_lsn >= '${lsn!.lsn}'::pg_lsn AS ok FROM pg_stat_replication WHERE application_name = '${o.b.name}'`,
        )
      ).some((r) => r.ok),
    30_000,
  );
  await partition(o.b);
  await o.waitUntil(
    'the standby to disconnect',
    async () => (await o.a.query('SELECT 1 FROM pg_stat_replication')).length === 0,
    30_000,
  );
  await o.afterCut?.();

  // Region A goes on committing, alone: this is what an asynchronous failover loses.
  const acked = o.witnessWrites();
  await o.waitUntil(
    'region A to commit witness writes on its own',
    async () => o.witnessWrites() >= acked + 10,
    o.timeoutMs,
  );
  const [stage] = Object.entries(openByStage).sort((x, y) => y[1] - x[1])[0]!;
  const woken = (Object.keys(ROLES) as Role[]).find((r) => ROLES[r].from === stage)!;
  const at = await o.demoProgress();
  signal([o.agents.get(woken)!], 'SIGCONT');
  await o.waitUntil(
    `the ${woken} to commit on its own`,
    async () => (await o.demoProgress()) > at,
    o.timeoutMs,
  );
  // The outside world must have seen it: the relay deletes a row once the broker acked it.
  const [{ last }] = (
    await sql<{ last: string | null }>`SELECT max(id)::text AS last FROM outbox`.execute(o.dbA)
  ).rows as [{ last: string | null }];
  await o.waitUntil(
    'the relay to publish what region A committed alone',
    async () =>
      last === null ||
      (await sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox WHERE id <= ${last}`.execute(o.dbA))
        .rows[0]!.n === 0,
    o.timeoutMs,
  );
  o.log(
    `[failover] region A alone: woke the ${woken} (open tasks ${JSON.stringify(openByStage)}), ` +
      `demo versions ${at} -> ${await o.demoProgress()}, witness writes ${acked} -> ${o.witnessWrites()}`,
  );
  return { woken, openByStage };
}
