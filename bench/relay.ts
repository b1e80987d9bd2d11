/**
 * Relay throughput and latency against the same broker and database:
 *  (a) drain a backlog of N messages of 200 bytes, messages/s;
 *  (b) steady load at fixed rates, p50/p99 from commit to broker ack;
 *  (c) the same messages through a raw kafkajs producer, and a raw Postgres insert loop.
 * Each phase also reports CPU µs per message of Node, the database's backends and the broker.
 * `--quick` runs a smaller version (under a minute) with the same JSON keys. `--modes poll,wal`
 * compares the polling and the WAL mode instead (bench/relayModes.ts).
 * `--clients kafkajs,platformatic,confluent` runs (a) and (b) on each client in turn, in one run.
 */

import { Partitioners } from 'kafkajs';
import { sql } from 'kysely';
import { createRelay } from '../relay/relay.js';
import type { KafkaClientName } from '../src/kafka/clientChoice.js';
import { createTopicsAndWait } from '../src/kafka/kafkajsAdmin.js';
import { createKafkaPublisher, kafkaClient } from '../src/kafka/publisher.js';
import { commitToAck } from './commitToAck.js';
import { type CpuPerMsg, cpuDuring, cpuLine, cpuPerMsg, cpuSources } from './cpu.js';
import { insertRows, outboxCount, PAYLOAD, rows } from './outboxRows.js';
import { rawPublisher } from './rawPublisher.js';
import { benchRelayModes } from './relayModes.js';
import { benchDatabase, clientsFlag, flag } from './support.js';

type SteadyResult = Awaited<ReturnType<typeof commitToAck>>;

export async function benchRelay(args: string[]): Promise<Record<string, unknown>> {
  // Both relay modes side by side, on a throw-away server with wal_level = logical.
  if (args.includes('--modes')) return benchRelayModes(args);
  const quick = args.includes('--quick');
  const n = flag(args, 'messages', quick ? 30_000 : 200_000);
  const steadySeconds = flag(args, 'seconds', quick ? 5 : 15);
  const batchSize = flag(args, 'batch', 2500); // the relay's default
  const clients = clientsFlag(args);
  const env = await benchDatabase('relay', 12);
  const brokers = env.stack.kafkaBrokers.split(',');
  const kafka = kafkaClient(brokers, 'bench-relay');
  const admin = kafka.admin();
  await admin.connect();
  const stamp = Date.now();
  const topics = {
    drain: `bench.drain.${stamp}`,
    steady: `bench.steady.${stamp}`,
    raw: `bench.raw.${stamp}`,
  };
  await createTopicsAndWait(
    admin,
    Object.values(topics).map((topic) => ({ topic, numPartitions: 6 })),
  );
  const cpuSrc = await cpuSources(env);
  try {
    // Per client, in the order given: (c2) the backlog inserted by a raw Postgres loop, 1,000
    // rows per transaction, then (a) drained by a relay on that client. The outbox is vacuumed
    // between clients (outside the measured sections) so each drain starts from the same table.
    const drains: Array<{
      client: KafkaClientName;
      perS: number;
      cpu: CpuPerMsg;
      insertPerS: number;
      insertCpu: CpuPerMsg;
      waits: string;
      rawPerS: number;
      rawCpu: CpuPerMsg;
    }> = [];
    for (const client of clients) {
      const backlog = rows(n, 1000, topics.drain);
      const insertCpu = await cpuDuring(cpuSrc, async () => {
        for (let i = 0; i < backlog.length; i += 1000) await insertRows(env.db, backlog.slice(i, i + 1000));
      });
      const relay = createRelay({
        db: env.db,
        publisher: createKafkaPublisher({ brokers, client }),
        batchSize,
        leaseTtlMs: 10_000,
        maxIdleMs: 20,
      });
      let running: ReturnType<typeof relay.run> | undefined;
      const drainCpu = await cpuDuring(cpuSrc, async () => {
        running = relay.run();
        // Wait on the relay's own counter first: a count(*) every 20 ms over a table of dead tuples
        // was Postgres CPU of the bench's, not the relay's. Then until the last delete is done.
        while (relay.stats().published < n) await new Promise((r) => setTimeout(r, 5));
        while ((await outboxCount(env.db)) > 0) await new Promise((r) => setTimeout(r, 20));
      });
      const w = relay.stats().waitMs;
      await relay.stop();
      await running;
      await sql`VACUUM outbox`.execute(env.db);
      // (c3) the same messages through this client's own Publisher, no Postgres (median of three runs).
      const rawPub = await rawPublisher({
        brokers,
        client,
        topic: topics.raw,
        n,
        batch: batchSize,
        cpu: cpuSrc,
      });
      drains.push({
        rawPerS: rawPub.msgs_per_s,
        rawCpu: rawPub.cpu,
        client,
        perS: n / drainCpu.seconds,
        cpu: cpuPerMsg(drainCpu.cpu, n),
        insertPerS: n / insertCpu.seconds,
        insertCpu: cpuPerMsg(insertCpu.cpu, n),
        waits: `claim ${(w.claim / 1000).toFixed(1)} s, publish ${(w.publish / 1000).toFixed(1)} s, delete ${(w.delete / 1000).toFixed(1)} s`,
      });
    }

    // (b) steady load: commit at a fixed rate, record commit time, relay hook records ack time;
    // each rate on every client in turn.
    const steady = (rate: number, client: KafkaClientName) =>
      commitToAck({
        db: env.db,
        brokers,
        topic: topics.steady,
        rate,
        seconds: steadySeconds,
        relay: { batchSize, leaseTtlMs: 10_000, maxIdleMs: 5 },
        cpu: cpuSrc,
        client,
      });
    const steadyBy = new Map<KafkaClientName, { at1k: SteadyResult; at5k: SteadyResult }>();
    const at1kBy = new Map<KafkaClientName, SteadyResult>();
    for (const client of clients) at1kBy.set(client, await steady(1000, client));
    for (const client of clients)
      steadyBy.set(client, { at1k: at1kBy.get(client)!, at5k: await steady(5000, client) });
    // The outbox must stay small: deleted rows are vacuumed, not accumulated.
    const table = await sql<{ bytes: string; dead: number; live: number }>`
      SELECT pg_total_relation_size('outbox')::text AS bytes, n_dead_tup::int AS dead, n_live_tup::int AS live
        FROM pg_stat_user_tables WHERE relname = 'outbox'`.execute(env.db);
    const outboxAfter = table.rows[0]!;

    // (c1) raw kafkajs producer: the same number of 200-byte messages, same batch size and settings.
    const producer = kafka.producer({
      idempotent: true,
      maxInFlightRequests: 1,
      createPartitioner: Partitioners.DefaultPartitioner,
    });
    await producer.connect();
    const raw = rows(n, 1000, topics.raw);
    const producerCpu = await cpuDuring(cpuSrc, async () => {
      for (let i = 0; i < raw.length; i += batchSize) {
        await producer.sendBatch({
          acks: -1,
          topicMessages: [
            {
              topic: topics.raw,
              messages: raw
                .slice(i, i + batchSize)
                .map((m) => ({ key: m.key, value: PAYLOAD, headers: { 'cairn-message-id': m.id } })),
            },
          ],
        });
      }
    });
    const rawProducerPerS = n / producerCpu.seconds;
    const rawProducerCpu = cpuPerMsg(producerCpu.cpu, n);
    await producer.disconnect();

    const f = (x: number) => x.toFixed(0).padStart(8);
    console.log(
      `messages: ${n} x 200 B, relay batch ${batchSize}, ${steadySeconds} s per steady rate, relay on ${clients.join(', ')} (in this order)`,
    );
    const byClient: Record<string, Record<string, unknown>> = {};
    for (const d of drains) {
      const { at1k, at5k } = steadyBy.get(d.client)!;
      const ratio = d.perS / rawProducerPerS;
      console.log(`[${d.client}]`);
      console.log(
        `relay drain (backlog)            ${f(d.perS)} msgs/s   (target >= 30,000 with kafkajs, >= 0.8 x the raw producer)`,
      );
      console.log(`  ${cpuLine(d.cpu)}`);
      console.log(`  drain loop waited: ${d.waits}`);
      console.log(
        `raw ${d.client} Publisher (no Postgres) ${f(d.rawPerS)} msgs/s; drain / it ${(d.perS / d.rawPerS).toFixed(2)}`,
      );
      console.log(`  ${cpuLine(d.rawCpu)}`);
      console.log(
        `drain / raw producer             ${ratio.toFixed(2).padStart(8)}          (target >= 0.8)`,
      );
      console.log(
        `raw Postgres insert (1k per tx)  ${f(d.insertPerS)} msgs/s (the backlog, before this drain)`,
      );
      console.log(`  ${cpuLine(d.insertCpu)}`);
      for (const s of [at1k, at5k]) {
        console.log(
          `steady ${s.rate}/s (achieved ${s.achieved.toFixed(0)}/s): commit->ack p50 ${s.p50.toFixed(1)} ms, p99 ${s.p99.toFixed(1)} ms (${s.samples} samples)`,
        );
        console.log(`  ${cpuLine(cpuPerMsg(s.cpu, s.sent))} (commit and relay, first commit to drained)`);
      }
      byClient[d.client] = {
        drain_msgs_per_s: Math.round(d.perS),
        drain_ratio: Number(ratio.toFixed(3)),
        raw_publisher_msgs_per_s: Math.round(d.rawPerS),
        drain_ratio_same_client: Number((d.perS / d.rawPerS).toFixed(3)),
        raw_insert_msgs_per_s: Math.round(d.insertPerS),
        p50_ms_at_1k: Number(at1k.p50.toFixed(2)),
        p99_ms_at_1k: Number(at1k.p99.toFixed(2)),
        p50_ms_at_5k: Number(at5k.p50.toFixed(2)),
        p99_ms_at_5k: Number(at5k.p99.toFixed(2)),
        cpu_by_phase: {
          drain: d.cpu,
          raw_publisher: d.rawCpu,
          raw_insert: d.insertCpu,
          steady_1k: cpuPerMsg(at1k.cpu, at1k.sent),
          steady_5k: cpuPerMsg(at5k.cpu, at5k.sent),
        },
      };
    }
    console.log(`raw kafkajs producer             ${f(rawProducerPerS)} msgs/s`);
    console.log(`  ${cpuLine(rawProducerCpu)}`);
    console.log(
      `outbox after ${n * clients.length} drained + ${Math.round(steadySeconds * 6000 * clients.length)} steady: ${(Number(outboxAfter.bytes) / 1024 / 1024).toFixed(1)} MiB on disk, ${outboxAfter.live} live / ${outboxAfter.dead} dead tuples`,
    );
    console.log(`CPU: ${cpuSrc.brokerSource}; ${cpuSrc.postgresSource}`);
    // The first client's figures keep the keys a single-client run always had.
    const first = byClient[clients[0]!]!;
    return {
      bench: 'relay',
      kafka_client: clients[0],
      kafka_clients: clients,
      ...first,
      raw_producer_msgs_per_s: Math.round(rawProducerPerS),
      outbox_bytes_after: Number(outboxAfter.bytes),
      outbox_dead_tuples_after: outboxAfter.dead,
      cpu_broker: cpuSrc.brokerSource,
      cpu_postgres: cpuSrc.postgresSource,
      cpu_by_phase: { ...(first.cpu_by_phase as object), raw_producer: rawProducerCpu },
      by_client: byClient,
    };
  } finally {
    await admin.deleteTopics({ topics: Object.values(topics) }).catch(() => {});
    await admin.disconnect();
    await env.close();
  }
}
