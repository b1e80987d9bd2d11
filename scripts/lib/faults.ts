import { type Kafka, Partitioners, type Producer } from 'kafkajs';
import { sql } from 'kysely';
import { clusterNodes, killNode, startNode, waitClusterReady } from '../../cli/stack/cluster.js';
import { startLocalKafka, stopLocalKafka } from '../../cli/stack/kafka.js';
import type { Db } from '../../src/db/database.js';
import { type Child, sigkill, sigterm, spawnTs } from './spawnTs.js';

/** A seeded pseudo-random source: the same seed draws the same faults and victims. */
export function seeded(seed: number) {
  let s = seed || 1;
  const rand = () => {
    s = (s * 1103515245 + 12345) % 2 ** 31;
    return s / 2 ** 31;
  };
  return { rand, pick: <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]! };
}

export interface ProcessSpec {
  name: string;
  entry: string;
  env: Record<string, string>;
}

/**
 * Named child processes that can be SIGKILLed and restarted under the same name. Each start
 * gets a fresh `CAIRN_RELAY_INSTANCE` (relays) so a lease owner can be traced to its process.
 */
export function createFleet(
  specs: readonly ProcessSpec[],
  o: {
    /** A process that exits without being told to: reported with its last output, then restarted (a supervisor). */
    onUnexpectedExit?: (name: string, code: number | null, outputTail: string) => void;
  } = {},
) {
  const byName = new Map(specs.map((s) => [s.name, s]));
  const live = new Map<string, Child>();
  const owners = new Map<string, Child>(); // relay instance id -> the process that used it
  const told = new WeakSet<Child>(); // processes we SIGKILLed or stopped on purpose
  let starts = 0;
  let unexpectedExits = 0;
  let stopping = false;
  const start = (name: string) => {
    const spec = byName.get(name);
    if (!spec) throw new Error(`no process named ${name}`);
    const instance = `${name}-${++starts}`;
    const child = spawnTs(name, spec.entry, { ...spec.env, CAIRN_RELAY_INSTANCE: instance });
    live.set(name, child);
    owners.set(instance, child);
    void child.exited.then((code) => {
      if (told.has(child) || stopping || live.get(name) !== child) return;
      unexpectedExits++;
      o.onUnexpectedExit?.(name, code, child.output().slice(-2000));
      start(name);
    });
  };
  const isAlive = (c: Child) => c.proc.exitCode === null && c.proc.signalCode === null;
  return {
    names: specs.map((s) => s.name),
    startAll: () => {
      for (const s of specs) start(s.name);
    },
    /** SIGKILL, then start again under the same name. */
    async crash(name: string) {
      const c = live.get(name);
      if (c) {
        told.add(c);
        await sigkill(c);
      }
      start(name);
    },
    /** SIGSTOP for `ms`, then SIGCONT: a process frozen past its leases and session (a long GC pause). */
    async pause(name: string, ms: number) {
      const c = live.get(name);
      if (!c || !isAlive(c)) return;
      c.proc.kill('SIGSTOP');
      await new Promise((r) => setTimeout(r, ms));
      if (isAlive(c)) c.proc.kill('SIGCONT');
    },
    /** Processes that exited without being told to (each was restarted). */
    unexpectedExits: () => unexpectedExits,
    async stopAll(graceMs = 5000) {
      stopping = true;
      await Promise.all([...live.values()].map((c) => sigterm(c, graceMs)));
    },
    /** Whether a lease holder (a relay instance id, or an agent id ending in ":<pid>") is a live process. */
    holderAlive(holder: string): boolean {
      const owner = owners.get(holder);
      if (owner) return isAlive(owner);
      const pid = Number(holder.split(':').pop());
      return [...live.values()].some((c) => c.proc.pid === pid && isAlive(c));
    },
    output: (name: string) => live.get(name)?.output() ?? '',
  };
}
export type Fleet = ReturnType<typeof createFleet>;

/**
 * Faults the demo and the chaos soak inject: each returns how many it injected. Duplicates
 * re-send already-published messages with their message ids, as a relay crash would.
 */
export function createFaults(o: {
  kafka: Kafka;
  db: Db;
  topics: readonly string[];
  /** application_name prefix of the sessions `pg_terminate_backend` may end (in this database only: the demo and a soak in the test suite share the server with other tests). */
  sessionPrefix: string;
  /** The harness's own session (never terminated). */
  ownSession: string;
  pick: <T>(xs: readonly T[]) => T;
  canRestartBroker: boolean;
  /** The local cluster's size when the broker is one (stack up --brokers N): a restart SIGKILLs one node. */
  clusterSize?: number;
}) {
  let producer: Producer | undefined;
  return {
    async duplicates(count: number): Promise<number> {
      if (!producer) {
        producer = o.kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
        await producer.connect();
      }
      const consumer = o.kafka.consumer({
        groupId: `cairn-tap-${Date.now()}-${Math.random()}`,
        maxWaitTimeInMs: 100,
      });
      const seen: Array<{
        topic: string;
        key: Buffer | null;
        value: Buffer | null;
        headers: Record<string, string>;
      }> = [];
      await consumer.connect();
      await consumer.subscribe({ topics: [...o.topics], fromBeginning: true });
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, 1500);
        void consumer.run({
          eachMessage: async ({ topic, message }) => {
            const headers: Record<string, string> = {};
            for (const [k, v] of Object.entries(message.headers ?? {})) headers[k] = String(v);
            seen.push({ topic, key: message.key, value: message.value, headers });
            if (seen.length >= 200) {
              clearTimeout(t);
              resolve();
            }
          },
        });
      });
      await consumer.disconnect();
      if (seen.length === 0) return 0;
      let sent = 0;
      for (let i = 0; i < count; i++) {
        const m = o.pick(seen);
        await producer
          .send({ topic: m.topic, messages: [{ key: m.key, value: m.value, headers: m.headers }] })
          .then(() => sent++)
          .catch(() => {});
      }
      return sent;
    },
    async terminateSessions(): Promise<number> {
      const r = await sql<{ n: number }>`
        SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
         WHERE application_name LIKE ${`${o.sessionPrefix}%`} AND application_name <> ${o.ownSession}
           AND datname = current_database() AND pid <> pg_backend_pid()`.execute(o.db);
      return r.rows[0]!.n;
    },
    /**
     * Stops the local broker (a controlled shutdown, SIGKILL after 2 minutes), waits `downMs`,
     * starts it again. On a starved machine a controlled shutdown took more than 30 s; killed,
     * the broker could register again only after its old session (60 s) had run out. A broker
     * that exits while starting is started again: a restart is a fault the system must ride
     * out, not a broker gone for the rest of the run.
     */
    async restartBroker(downMs = 2000): Promise<number> {
      if (!o.canRestartBroker) return 0;
      if ((o.clusterSize ?? 1) > 1) {
        // A broker lost without a controlled shutdown: one node of the cluster SIGKILLed,
        // started again after `downMs` (its partitions move to the others meanwhile).
        const nodes = clusterNodes(o.clusterSize!);
        const victim = o.pick(nodes);
        await killNode(victim);
        await new Promise((r) => setTimeout(r, downMs));
        startNode(victim);
        await waitClusterReady(nodes, () => {});
        return 1;
      }
      await stopLocalKafka();
      await new Promise((r) => setTimeout(r, downMs));
      for (let attempt = 1; ; attempt++) {
        try {
          await startLocalKafka(() => {});
          return 1;
        } catch (err) {
          // Still booting past the deadline: startLocalKafka waits for it again next time.
          if (attempt >= 3) throw err;
        }
      }
    },
    async close() {
      await producer?.disconnect().catch(() => {});
    },
  };
}
export type Faults = ReturnType<typeof createFaults>;

export { type Child, sigkill };
