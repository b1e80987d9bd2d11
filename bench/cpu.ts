import { readFile } from 'node:fs/promises';
import { sql } from 'kysely';
import { clusterNodes, nodePid } from '../cli/stack/cluster.js';
import { isAlive, readPid } from '../cli/stack/kafka.js';
import type { Db } from '../src/db/database.js';
import type { BenchEnv } from './support.js';

/** Clock ticks per second of /proc/<pid>/stat's utime and stime (Linux's USER_HZ). */
const TICKS_PER_S = 100;

/**
 * CPU seconds (user + system) in the text of /proc/<pid>/stat. The command name (field 2)
 * may hold spaces and ')', so the fields are counted from after the LAST ')': state is
 * then field 0, utime field 11 and stime field 12. Undefined when the line has no such fields.
 */
export function parseStatCpuS(stat: string): number | undefined {
  const close = stat.lastIndexOf(')');
  if (close < 0) return undefined;
  const f = stat
    .slice(close + 1)
    .trim()
    .split(/\s+/);
  const utime = Number(f[11]);
  const stime = Number(f[12]);
  if (f.length < 13 || !Number.isFinite(utime) || !Number.isFinite(stime)) return undefined;
  return (utime + stime) / TICKS_PER_S;
}

/** The command name of a local process (/proc/<pid>/comm); undefined when there is none. */
async function processName(pid: number): Promise<string | undefined> {
  try {
    return (await readFile(`/proc/${pid}/comm`, 'utf8')).trim();
  } catch {
    return undefined;
  }
}

/** CPU seconds of a process, from /proc; undefined when it is gone or unreadable. */
async function processCpuS(pid: number): Promise<number | undefined> {
  try {
    return parseStatCpuS(await readFile(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return undefined;
  }
}

/**
 * The Postgres backends serving `database` right now (they are local processes here),
 * including the one running this query: it is a pooled connection the bench also works
 * through (excluding it lost a whole backend's CPU when the pool held one connection).
 */
async function backendPids(db: Db, database: string): Promise<number[]> {
  const { rows } = await sql<{ pid: number }>`
    SELECT pid FROM pg_stat_activity WHERE datname = ${database}`.execute(db);
  return rows.map((r) => r.pid);
}

/** What a measurement reads: the database's backends, the broker's JVMs, any child processes. */
export interface CpuSources {
  db: Db;
  database: string;
  /** False when the backends' pids are not processes of this machine (a container, a remote host). */
  postgresLocal: boolean;
  /** Why Postgres is (not) measured. */
  postgresSource: string;
  /** The local stack's broker JVM pids; null when the broker is not the local stack's. */
  brokerPids: number[] | null;
  /** Why the broker is (not) measured, printed once per bench and put in its JSON. */
  brokerSource: string;
  /** Processes the bench spawned (none today); counted with Node. */
  childPids?: () => number[];
}

/**
 * The sources of a bench's database and broker. The broker's CPU is read only when it is the
 * local stack's JVM (its pid file under .cairn); a broker elsewhere (KAFKA_BROKERS, a
 * container) is reported as null, never as 0. Postgres likewise: its backends are read from
 * /proc only when the pid Postgres gives for this connection is a local `postgres` process
 * (in a container or on another host the same number names another process, or none).
 */
export async function cpuSources(env: BenchEnv): Promise<CpuSources> {
  const database = new URL(env.url).pathname.slice(1);
  const { rows } = await sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`.execute(env.db);
  const postgresLocal = (await processName(rows[0]!.pid)) === 'postgres';
  const base = {
    db: env.db,
    database,
    postgresLocal,
    postgresSource: postgresLocal
      ? `Postgres: every backend of ${database} (pg_stat_activity), local processes`
      : `Postgres not measured: ${env.stack.source.postgres}'s backends are not processes of this machine`,
  };
  if (!env.stack.localKafka) {
    return {
      ...base,
      brokerPids: null,
      brokerSource: `broker not measured: the one from ${env.stack.source.kafka} is not the local stack's JVM`,
    };
  }
  const size = Number(process.env.CAIRN_KAFKA_BROKERS_LOCAL ?? 1);
  const pids =
    size > 1
      ? clusterNodes(size).map((n) => nodePid(n))
      : [readPid()].map((p) => (p && isAlive(p) ? p : undefined));
  const names = await Promise.all(pids.map((p) => (p ? processName(p) : undefined)));
  if (names.some((n) => n !== 'java')) {
    return { ...base, brokerPids: null, brokerSource: 'broker not measured: no live JVM in its pid file' };
  }
  const live = pids as number[];
  return { ...base, brokerPids: live, brokerSource: `broker: JVM pid ${live.join(', ')} (local stack)` };
}

/** CPU seconds spent during a measured section, per process kind; null where not measured. */
export interface CpuSpent {
  nodeS: number;
  postgresS: number | null;
  brokerS: number | null;
}

async function sumCpuS(pids: number[]): Promise<Map<number, number>> {
  const out = new Map<number, number>();
  for (const pid of pids) {
    const s = await processCpuS(pid);
    if (s !== undefined) out.set(pid, s);
  }
  return out;
}

const delta = (after: Map<number, number>, before: Map<number, number>) =>
  [...after].reduce((sum, [pid, s]) => sum + s - (before.get(pid) ?? 0), 0);

/**
 * Measures the CPU `run` costs: Node's own (process.cpuUsage, every thread) plus child
 * processes, every backend of the database and the broker JVM, read from /proc before and
 * after. Backends are listed again at the end: one that appeared during the run counts from
 * 0 (its whole life is inside the window); one that ended during it is lost, so keep pools
 * warm. `seconds` is the wall time of `run` alone, without the readings around it; `loopBusy`
 * the share of it Node's event loop was not waiting (1: its one thread was the bound). CPU per message is the figure that holds on a shared, noisy machine, where rates do not.
 */
export async function cpuDuring<T>(
  src: CpuSources,
  run: () => Promise<T>,
  opts: { pollBackendsMs?: number } = {},
): Promise<{ result: T; cpu: CpuSpent; seconds: number; loopBusy: number }> {
  const children = () => src.childPids?.() ?? [];
  const backends = async () => (src.postgresLocal ? backendPids(src.db, src.database) : []);
  const pgBefore = await sumCpuS(await backends());
  const brokerBefore = await sumCpuS(src.brokerPids ?? []);
  const childBefore = await sumCpuS(children());
  // Backends that connect and leave within the run (another process's, like pgbench's) are
  // read every pollBackendsMs and count up to their last reading: at most one interval lost each.
  const lastSeen = new Map<number, number>();
  let polling: Promise<void> = Promise.resolve();
  const poll =
    opts.pollBackendsMs && src.postgresLocal
      ? setInterval(() => {
          polling = polling.then(async () => {
            for (const [pid, s] of await sumCpuS(await backends())) lastSeen.set(pid, s);
          });
        }, opts.pollBackendsMs)
      : undefined;
  const node = process.cpuUsage();
  const loop = performance.eventLoopUtilization();
  const started = performance.now();
  let result: T;
  try {
    result = await run();
  } finally {
    clearInterval(poll);
  }
  const seconds = (performance.now() - started) / 1000;
  const loopBusy = performance.eventLoopUtilization(loop).utilization;
  const nodeUsed = process.cpuUsage(node);
  await polling;
  const childS = delta(await sumCpuS(children()), childBefore);
  const brokerAfter = await sumCpuS(src.brokerPids ?? []);
  const postgresS = src.postgresLocal
    ? delta(new Map([...lastSeen, ...(await sumCpuS(await backends()))]), pgBefore)
    : null;
  return {
    result,
    seconds,
    loopBusy,
    cpu: {
      nodeS: (nodeUsed.user + nodeUsed.system) / 1e6 + childS,
      postgresS,
      // A broker that died during the run cannot be read: not measured, rather than a low figure.
      brokerS:
        src.brokerPids && brokerAfter.size === src.brokerPids.length
          ? delta(brokerAfter, brokerBefore)
          : null,
    },
  };
}

/** Sums measurements of several rounds of one phase. */
export function addCpu(a: CpuSpent, b: CpuSpent): CpuSpent {
  return {
    nodeS: a.nodeS + b.nodeS,
    postgresS: a.postgresS === null || b.postgresS === null ? null : a.postgresS + b.postgresS,
    brokerS: a.brokerS === null || b.brokerS === null ? null : a.brokerS + b.brokerS,
  };
}

export const NO_CPU: CpuSpent = { nodeS: 0, postgresS: 0, brokerS: 0 };

/** One phase's figures for the final JSON line. */
export interface CpuPerMsg {
  messages: number;
  /** Node + Postgres + broker; without what was not measured (see cpu_broker, cpu_postgres). */
  cpu_us_per_msg: number;
  cpu_us_per_msg_by_process: { node: number; postgres: number | null; broker: number | null };
}

const us = (s: number, n: number) => Number(((s / n) * 1e6).toFixed(1));

export function cpuPerMsg(cpu: CpuSpent, messages: number): CpuPerMsg {
  const n = Math.max(1, messages);
  return {
    messages,
    cpu_us_per_msg: us(cpu.nodeS + (cpu.postgresS ?? 0) + (cpu.brokerS ?? 0), n),
    cpu_us_per_msg_by_process: {
      node: us(cpu.nodeS, n),
      postgres: cpu.postgresS === null ? null : us(cpu.postgresS, n),
      broker: cpu.brokerS === null ? null : us(cpu.brokerS, n),
    },
  };
}

/** `CPU µs/msg: total T (Node n, Postgres p, broker b)`, the line every phase prints. */
export function cpuLine(c: CpuPerMsg, unit = 'msg'): string {
  const p = c.cpu_us_per_msg_by_process;
  const shown = (v: number | null) => (v === null ? 'not measured' : String(v));
  const missing = [p.postgres === null ? 'Postgres' : '', p.broker === null ? 'the broker' : '']
    .filter(Boolean)
    .join(' and ');
  const total = missing ? `${c.cpu_us_per_msg} without ${missing}` : String(c.cpu_us_per_msg);
  return `CPU µs/${unit}: total ${total} (Node ${p.node}, Postgres ${shown(p.postgres)}, broker ${shown(p.broker)})`;
}
