import { randomBytes } from 'node:crypto';
import { resolveStack, type Stack } from '../cli/stack/resolve.js';
import { createScratchDatabase } from '../scripts/lib/scratchDatabase.js';
import { createDb, type Db } from '../src/db/database.js';
import { migrateToLatest } from '../src/db/migrate.js';
import { defaultKafkaClient, type KafkaClientName, kafkaClientNames } from '../src/kafka/clientChoice.js';

export interface BenchEnv {
  stack: Stack;
  db: Db;
  url: string;
  close(): Promise<void>;
}

/** A fresh, migrated database of its own for one benchmark run (dropped at close). */
export async function benchDatabase(label: string, max = 20): Promise<BenchEnv> {
  const stack = await resolveStack((l) => console.error(`[cairn stack] ${l}`));
  const scratch = await createScratchDatabase(
    stack.databaseUrl,
    `cairn_bench_${label}_${randomBytes(3).toString('hex')}`,
  );
  const url = scratch.url;
  const db = createDb({ connectionString: url, max });
  await migrateToLatest(db);
  return {
    stack,
    db,
    url,
    async close() {
      await db.destroy();
      await scratch.drop();
      await stack.stop();
    },
  };
}

/** Runs `op` from `workers` loops for `seconds`; returns operations per second. */
export async function throughput(
  workers: number,
  seconds: number,
  op: (worker: number) => Promise<void>,
): Promise<number> {
  const deadline = Date.now() + seconds * 1000;
  let done = 0;
  const started = process.hrtime.bigint();
  await Promise.all(
    Array.from({ length: workers }, async (_, w) => {
      while (Date.now() < deadline) {
        await op(w);
        done++;
      }
    }),
  );
  const elapsed = Number(process.hrtime.bigint() - started) / 1e9;
  return done / elapsed;
}

export function flag(args: string[], name: string, fallback: number): number {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] ? Number(args[i + 1]) : fallback;
}

/**
 * The Kafka clients a bench runs the relay or inbox on, side by side in one run:
 * `--clients kafkajs,platformatic,confluent`; without it the one CAIRN_KAFKA_CLIENT names.
 */
export function clientsFlag(args: string[]): KafkaClientName[] {
  const i = args.indexOf('--clients');
  if (i < 0 || !args[i + 1]) return [defaultKafkaClient()];
  const names = args[i + 1]!.split(',').map((s) => s.trim());
  for (const n of names) {
    if (!(kafkaClientNames as readonly string[]).includes(n)) {
      throw new Error(
        `--clients names "${n}", which is not a Kafka client Cairn has: use ${kafkaClientNames.join(', ')}`,
      );
    }
  }
  return names as KafkaClientName[];
}

/** The middle item by `key` (the upper one of an even count). */
export function medianOf<T>(items: readonly T[], key: (t: T) => number): T {
  return [...items].sort((a, b) => key(a) - key(b))[Math.floor(items.length / 2)]!;
}

/** The median of numbers (the mean of the middle two of an even count), to three decimals. */
export function median(xs: readonly number[]): number {
  const sorted = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  const m = sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
  return Number(m.toFixed(3));
}
