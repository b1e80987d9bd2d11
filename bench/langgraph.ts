/**
 * LangGraph checkpoint savers, same database, same run: `put` + `getTuple` (a superstep's
 * checkpoint, then reading the thread's head, as a resuming graph does) per second and CPU
 * per operation (Node, the Postgres backends and the broker, which should idle), for LangGraph's own Postgres saver and for
 * CairnSaver with its guarantees (head CAS, digests and chain, HMAC-signed rows) and without
 * the signatures.
 */

import type { RunnableConfig } from '@langchain/core/runnables';
import { emptyCheckpoint, uuid6 } from '@langchain/langgraph-checkpoint';
import { PostgresSaver } from '@langchain/langgraph-checkpoint-postgres';
import pg from 'pg';
import { CairnSaver } from '../langgraph/index.js';
import { addCpu, type CpuSpent, cpuDuring, cpuLine, cpuPerMsg, cpuSources, NO_CPU } from './cpu.js';
import { benchDatabase, flag, throughput } from './support.js';

type Saver = Pick<CairnSaver, 'put' | 'getTuple'>;

/** A message history of about `bytes`, as a chat agent's `messages` channel holds. */
const messages = (step: number, bytes: number) =>
  Array.from({ length: Math.max(1, Math.round(bytes / 200)) }, (_, i) => ({
    role: i % 2 ? 'assistant' : 'user',
    content: `step ${step} message ${i} `.padEnd(180, '.'),
  }));

/** One worker's thread: each operation puts the next checkpoint and reads the head back. */
function stepper(saver: Saver, label: string, workers: number, valueBytes: number) {
  const heads: RunnableConfig[] = Array.from({ length: workers }, (_, w) => ({
    configurable: { thread_id: `${label}-${w}-${uuid6(-1)}`, checkpoint_ns: '' },
  }));
  const steps = new Array<number>(workers).fill(0);
  return async (w: number) => {
    const step = ++steps[w]!;
    const cp = {
      ...emptyCheckpoint(),
      id: uuid6(-1),
      channel_values: { messages: messages(step, valueBytes), next: `node-${step % 4}` },
      channel_versions: { messages: step, next: step },
    };
    const config = await saver.put(heads[w]!, cp, { source: 'loop', step, parents: {} }, cp.channel_versions);
    const tuple = await saver.getTuple({ configurable: { thread_id: config.configurable?.thread_id } });
    if (tuple?.checkpoint.id !== cp.id)
      throw new Error(`${label}: read ${tuple?.checkpoint.id}, wrote ${cp.id}`);
    heads[w] = config;
  };
}

export async function benchLanggraph(args: string[]): Promise<Record<string, unknown>> {
  const workers = flag(args, 'workers', 4);
  const seconds = flag(args, 'seconds', args.includes('--quick') ? 3 : 10);
  const valueBytes = flag(args, 'value-bytes', 2000);
  const env = await benchDatabase('langgraph', workers + 2);
  const cpuSrc = await cpuSources(env);
  const pool = new pg.Pool({ connectionString: env.url, max: workers + 2 });
  try {
    const postgres = new PostgresSaver(pool, undefined, { schema: 'langgraph_postgres' });
    await postgres.setup();
    const ring = { current: 'bench', keys: { bench: Buffer.alloc(32, 3) } };
    const savers: Array<[string, Saver]> = [
      ['postgres_saver', postgres],
      ['cairn_saver', new CairnSaver({ db: env.db, keyRing: ring })],
      ['cairn_saver_unsigned', new CairnSaver({ db: env.db })],
    ];
    // Warm both pools and the plans, then measure each saver twice, alternating, so drift
    // on a shared machine falls on both.
    for (const [label, saver] of savers)
      await throughput(workers, 1, stepper(saver, `warm-${label}`, workers, valueBytes));
    const runs: Record<string, { ops: number; seconds: number; cpu: CpuSpent }> = {};
    for (let round = 0; round < 2; round++) {
      for (const [label, saver] of savers) {
        const op = stepper(saver, `${label}-${round}`, workers, valueBytes);
        let done = 0;
        const { cpu, seconds: took } = await cpuDuring(cpuSrc, () =>
          throughput(workers, seconds / 2, async (w) => {
            await op(w);
            done++;
          }),
        );
        const r = runs[label] ?? { ops: 0, seconds: 0, cpu: NO_CPU };
        runs[label] = r;
        r.ops += done;
        r.seconds += took;
        r.cpu = addCpu(r.cpu, cpu);
      }
    }
    const figures = Object.fromEntries(
      Object.entries(runs).map(([label, r]) => [
        label,
        {
          put_get_per_s: Math.round(r.ops / r.seconds),
          cpu_us_per_op: Math.round(((r.cpu.nodeS + (r.cpu.postgresS ?? 0)) / r.ops) * 1e6),
          node_us_per_op: Math.round((r.cpu.nodeS / r.ops) * 1e6),
          postgres_us_per_op: r.cpu.postgresS === null ? null : Math.round((r.cpu.postgresS / r.ops) * 1e6),
          // The common per-phase fields; a "message" here is one put + getTuple.
          ...cpuPerMsg(r.cpu, r.ops),
        },
      ]),
    );
    const pgRate = figures.postgres_saver!.put_get_per_s;
    const ratio = (label: string) => Number((figures[label]!.put_get_per_s / pgRate).toFixed(2));
    console.log(
      `workers ${workers}, ${seconds} s per saver, channel value ~${valueBytes} B, put + getTuple per operation`,
    );
    for (const [label, f] of Object.entries(figures)) {
      console.log(
        `  ${label.padEnd(22)} ${String(f.put_get_per_s).padStart(6)} ops/s  CPU ${f.cpu_us_per_op} µs/op (Node ${f.node_us_per_op}, Postgres ${f.postgres_us_per_op})`,
      );
      console.log(`    ${cpuLine(f, 'op')}`);
    }
    console.log(`  CPU: ${cpuSrc.brokerSource}; ${cpuSrc.postgresSource}`);
    console.log(
      `  CairnSaver / PostgresSaver: ${ratio('cairn_saver')} signed, ${ratio('cairn_saver_unsigned')} unsigned`,
    );
    return {
      bench: 'langgraph',
      workers,
      seconds,
      value_bytes: valueBytes,
      cpu_broker: cpuSrc.brokerSource,
      cpu_postgres: cpuSrc.postgresSource,
      ...figures,
      cairn_vs_postgres_saver: ratio('cairn_saver'),
      cairn_unsigned_vs_postgres_saver: ratio('cairn_saver_unsigned'),
    };
  } finally {
    await pool.end();
    await env.close();
  }
}
