import { readFile } from 'node:fs/promises';
import { sql } from 'kysely';
import type { Db } from '../src/db/database.js';

/** Clock ticks per second of /proc/<pid>/stat's utime and stime (Linux's USER_HZ). */
const TICKS_PER_S = 100;

/** CPU seconds (user + system) of a process, from /proc; 0 when it is gone or unreadable. */
async function processCpuS(pid: number): Promise<number> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which may hold spaces) start after the last ')'.
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / TICKS_PER_S;
  } catch {
    return 0;
  }
}

/** The Postgres backends serving `database` right now (they are local processes here). */
async function backendPids(db: Db, database: string): Promise<number[]> {
  const { rows } = await sql<{ pid: number }>`
    SELECT pid FROM pg_stat_activity WHERE datname = ${database} AND pid <> pg_backend_pid()`.execute(db);
  return rows.map((r) => r.pid);
}

/** CPU spent while `run` ran: this Node process, and the Postgres backends of `database`. */
export interface CpuSpent {
  nodeS: number;
  postgresS: number;
}

/**
 * Measures the CPU `run` costs: Node's own (process.cpuUsage) and that of every backend of
 * the database, read from /proc before and after (a backend that appears during the run
 * counts from 0, one that ends during it is lost: keep pools warm). CPU per operation is the
 * figure that holds on a shared, noisy machine, where rates do not.
 */
export async function cpuDuring<T>(
  db: Db,
  database: string,
  run: () => Promise<T>,
): Promise<{ result: T; cpu: CpuSpent }> {
  const before = new Map<number, number>();
  for (const pid of await backendPids(db, database)) before.set(pid, await processCpuS(pid));
  const node = process.cpuUsage();
  const result = await run();
  const nodeUsed = process.cpuUsage(node);
  let postgresS = 0;
  for (const pid of await backendPids(db, database)) {
    postgresS += (await processCpuS(pid)) - (before.get(pid) ?? 0);
  }
  return { result, cpu: { nodeS: (nodeUsed.user + nodeUsed.system) / 1e6, postgresS } };
}
