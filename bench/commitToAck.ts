import { sql } from 'kysely';
import { createRelayWithTestHooks, type RelayOptions } from '../relay/relay.js';
import type { Db } from '../src/db/database.js';
import type { KafkaClientName } from '../src/kafka/clientChoice.js';
import { createKafkaPublisher } from '../src/kafka/publisher.js';
import { OUTBOX_CHANNEL } from '../src/outbox/outbox.js';
import { type CpuSources, type CpuSpent, cpuDuring } from './cpu.js';
import { insertRows, outboxCount, percentile, rows } from './outboxRows.js';

/**
 * Commits messages at a fixed rate for `seconds` while a relay publishes them, and measures
 * each one from its commit to the broker's ack (the relay's afterPublish hook), and the CPU
 * spent from the first commit until the relay has drained the last one (not the relay's start).
 */
export async function commitToAck(opts: {
  db: Db;
  brokers: string[];
  topic: string;
  rate: number;
  seconds: number;
  relay: Partial<Omit<RelayOptions, 'db' | 'publisher'>>;
  notify?: boolean;
  /** Messages written to the WAL only (createOutbox({ walMessages: true })). */
  walMessages?: boolean;
  cpu: CpuSources;
  /** The relay's Kafka client (default: CAIRN_KAFKA_CLIENT, else kafkajs). */
  client?: KafkaClientName;
}): Promise<{
  rate: number;
  achieved: number;
  p50: number;
  p99: number;
  samples: number;
  sent: number;
  cpu: CpuSpent;
}> {
  const committed = new Map<string, number>();
  let probing: string | undefined;
  const latencies: number[] = [];
  const relay = createRelayWithTestHooks(
    {
      ...opts.relay,
      db: opts.db,
      publisher: createKafkaPublisher({
        brokers: opts.brokers,
        ...(opts.client ? { client: opts.client } : {}),
      }),
    },
    {
      afterPublish: (_b, ids) => {
        if (probing !== undefined && ids.includes(probing)) probing = undefined;
        const now = performance.now();
        for (const id of ids) {
          const c = committed.get(id);
          if (c !== undefined) latencies.push(now - c);
        }
      },
    },
  );
  const running = relay.run();
  // Measure from the moment the relay owns every lane and, in the WAL mode, streams with
  // nothing held (rows committed before its stream started go through the table's sweep).
  const settled = () => {
    const st = relay.stats();
    return (
      st.lanesOwned === 32 &&
      (!st.wal || (st.wal.streaming && st.wal.heldLanes === 0 && st.wal.heldKeys === 0))
    );
  };
  for (const until = Date.now() + 30_000; !settled() && Date.now() < until; ) {
    await new Promise((r) => setTimeout(r, 20));
  }
  // Then one message through: in the WAL mode the stream first reads again what its slot holds
  // (after a backlog, about a second per 100,000 rows on this machine), and commits wait behind it.
  const probe = rows(1, 1, opts.topic);
  await insertRows(opts.db, probe, opts.walMessages);
  probing = probe[0]!.id;
  for (const until = Date.now() + 60_000; probing !== undefined && Date.now() < until; ) {
    await new Promise((r) => setTimeout(r, 20));
  }
  let sent = 0;
  const { cpu } = await cpuDuring(opts.cpu, async () => {
    const tickMs = 10;
    const perTick = Math.max(1, Math.round((opts.rate * tickMs) / 1000));
    const end = performance.now() + opts.seconds * 1000;
    let next = performance.now();
    while (performance.now() < end) {
      const batch = rows(perTick, 1000, opts.topic);
      await opts.db.transaction().execute(async (trx) => {
        await insertRows(trx, batch, opts.walMessages);
        if (opts.notify) await sql`SELECT pg_notify(${OUTBOX_CHANNEL}, '')`.execute(trx);
      });
      const at = performance.now();
      for (const m of batch) committed.set(m.id, at);
      sent += batch.length;
      next += tickMs;
      const wait = next - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    }
    while ((await outboxCount(opts.db)) > 0) await new Promise((r) => setTimeout(r, 20));
    // WAL messages leave no row to count: until the broker acked the last one.
    for (
      const until = Date.now() + 30_000;
      opts.walMessages && latencies.length < sent && Date.now() < until;
    ) {
      await new Promise((r) => setTimeout(r, 5));
    }
  });
  await relay.stop();
  await running;
  const sorted = latencies.sort((a, b) => a - b);
  return {
    rate: opts.rate,
    achieved: sent / opts.seconds,
    p50: percentile(sorted, 50),
    p99: percentile(sorted, 99),
    samples: sorted.length,
    sent,
    cpu,
  };
}
