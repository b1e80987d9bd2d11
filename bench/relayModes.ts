/**
 * The relay's two modes side by side in one run (`npm run bench -- relay --modes poll,wal
 * [--clients kafkajs,platformatic]`: every mode with every client),
 * on one throw-away server with wal_level = logical (the machine's own may run `replica`),
 * a fresh database per mode, the same broker:
 *  - burst: N messages of 200 B committed as fast as one connection can (1,000 per
 *    transaction) while the relay runs; CPU per message of the inserts and the relay, and of
 *    the relay alone (minus the same inserts measured without a relay);
 *  - steady: fixed rates, commit to broker ack p50/p99 and CPU per message.
 * (A backlog the relay finds at start is read from the table in both modes: the WAL mode's
 * stream only carries rows committed while it streams; see docs/relay-modes.md.)
 */

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { resolveStack } from '../cli/stack/resolve.js';
import { createRelay, type RelayOptions } from '../relay/relay.js';
import { type PgServer, startPrimary } from '../scripts/failover/pgCluster.js';
import { createDb } from '../src/db/database.js';
import { migrateToLatest } from '../src/db/migrate.js';
import { defaultKafkaClient, type KafkaClientName, kafkaClientNames } from '../src/kafka/clientChoice.js';
import { createTopicsAndWait } from '../src/kafka/kafkajsAdmin.js';
import { createKafkaPublisher, kafkaClient, type Publisher } from '../src/kafka/publisher.js';
import { commitToAck } from './commitToAck.js';
import { type CpuPerMsg, type CpuSpent, cpuDuring, cpuLine, cpuPerMsg, cpuSources } from './cpu.js';
import { insertRows, outboxCount, rows } from './outboxRows.js';
import { type RawPublisherRun, rawPublisher } from './rawPublisher.js';
import { type DrainRun, drainBacklog, instantPublisher } from './relayDrain.js';
import type { BenchEnv } from './support.js';
import { flag, median, medianOf } from './support.js';

type Mode = 'poll' | 'wal' | 'walmsg';
const MODES: readonly Mode[] = ['poll', 'wal', 'walmsg'];
const MODE_NAMES: Record<Mode, string> = { poll: 'polling', wal: 'WAL (rows)', walmsg: 'WAL messages' };

interface ModeResult {
  drain_msgs_per_s: number;
  /** The median of each drain's rate over the rate of the Publisher run beside it (after it, or before it in every other pair). */
  drain_ratio_to_raw_publisher: number;
  /** The drain from the relay's first acknowledged batch to its last (its start-up left out). */
  drain_after_first_ack_msgs_per_s: number;
  /** That, against the Publisher's run after its own first ack: neither's start-up counts. */
  drain_after_first_ack_ratio: number;
  /** Each pair, with the share of each run Node's event loop was busy (1: its one thread was the bound). */
  pairs: Array<{
    drain_msgs_per_s: number;
    raw_publisher_msgs_per_s: number;
    drain_loop_busy: number;
    raw_publisher_loop_busy: number;
  }>;
  /** The same drain through a Publisher that acknowledges at once (the relay's own work, no client's). */
  drain_no_broker_msgs_per_s: number;
  burst_msgs_per_s: number;
  streamed: number;
  p50_ms_at_1k: number;
  p99_ms_at_1k: number;
  p50_ms_at_5k: number;
  p99_ms_at_5k: number;
  cpu_by_phase: Record<string, CpuPerMsg>;
}

/**
 * A slot's restart point (where decoding starts again when a relay starts) moves only at a
 * record of the running transactions, which Postgres writes every 15 s while the WAL grows
 * (and at each checkpoint), once the relay has confirmed past it. The bench's phases last
 * seconds: without one, the drain's relay would first decode again all the WAL of the burst
 * before it (measured: 0.5 s more at start, 6.1-6.5 µs of Postgres CPU per message instead of
 * 4.1-4.3), which a relay running longer than 15 s does not. So the burst's relay, caught
 * up, sees a checkpoint (as the bench's superuser) and confirms past it before it stops.
 */
async function advanceRestartPoint(server: PgServer, slot: string): Promise<string> {
  const [before] = await server.query<{ restart: string }>(
    `SELECT restart_lsn::text AS restart FROM pg_replication_slots WHERE slot_name = '${slot}'`,
  );
  await server.query('CHECKPOINT');
  const [at] = await server.query<{ lsn: string }>('SELECT pg_current_wal_lsn()::text AS lsn');
  for (let i = 0; i < 100; i++) {
    const [r] = await server.query<{ moved: boolean; restart: string }>(
      `SELECT restart_lsn >= '${at!.lsn}'::pg_lsn - 4096 AS moved, restart_lsn::text AS restart
         FROM pg_replication_slots WHERE slot_name = '${slot}'`,
    );
    if (r?.moved) return `${before?.restart} -> ${r.restart}`;
    await new Promise((x) => setTimeout(x, 50));
  }
  return `${before?.restart} -> not moved in 5 s`;
}

const minus = (a: CpuSpent, b: CpuSpent): CpuSpent => ({
  nodeS: a.nodeS - b.nodeS,
  postgresS: a.postgresS === null || b.postgresS === null ? null : a.postgresS - b.postgresS,
  brokerS: a.brokerS === null || b.brokerS === null ? null : a.brokerS - b.brokerS,
});

export async function benchRelayModes(args: string[]): Promise<Record<string, unknown>> {
  const quick = args.includes('--quick');
  const i = args.indexOf('--modes');
  const modes = (i >= 0 ? (args[i + 1] ?? '') : 'poll,wal').split(',') as Mode[];
  for (const m of modes)
    if (!MODES.includes(m)) throw new Error(`--modes: ${m} is not one of ${MODES.join(', ')}`);
  const c = args.indexOf('--clients');
  const clients = (c >= 0 ? (args[c + 1] ?? '') : defaultKafkaClient()).split(',') as KafkaClientName[];
  for (const k of clients) {
    if (!(kafkaClientNames as readonly string[]).includes(k))
      throw new Error(`--clients: ${k} is not one of ${kafkaClientNames.join(', ')}`);
  }
  const n = flag(args, 'messages', quick ? 20_000 : 100_000);
  const steadySeconds = flag(args, 'seconds', quick ? 5 : 15);
  const pairCount = flag(args, 'pairs', quick ? 1 : 3);
  const stack = await resolveStack((l) => console.error(`[cairn stack] ${l}`));
  const brokers = stack.kafkaBrokers.split(',');
  const root = mkdtempSync(join(tmpdir(), 'cairn-bench-wal-'));
  const server = await startPrimary(root, 'bench', { walLevel: 'logical' });
  const admin = kafkaClient(brokers, 'bench-relay-modes').admin();
  await admin.connect();
  const topics: string[] = [];
  const results: Record<string, ModeResult> = {};
  const restartPoint: Record<string, string> = {};
  const rawRuns: Record<string, RawPublisherRun[]> = {};
  try {
    for (const client of clients)
      for (const mode of modes) {
        const combo = `${mode}/${client}`;
        const name = `bench_${mode}_${client}`;
        await server.query(`CREATE DATABASE ${name}`);
        const url = server.url(name);
        const db = createDb({ connectionString: url, max: 12 });
        await migrateToLatest(db);
        const env: BenchEnv = { stack, db, url, close: () => db.destroy() };
        const cpuSrc = await cpuSources(env);
        const topic = `bench.modes.${mode}.${client}.${Date.now()}`;
        topics.push(topic);
        await createTopicsAndWait(admin, [{ topic, numPartitions: 6 }]);
        const relayOptions: Partial<RelayOptions> = {
          batchSize: 2500,
          leaseTtlMs: 10_000,
          maxIdleMs: 5,
          ...(mode !== 'poll' ? { wal: { connectionString: url, slot: name } } : {}),
        };

        // The inserts alone, as the burst commits them, with no relay: what the burst's figure holds besides the relay.
        const batches = Array.from({ length: Math.ceil(n / 1000) }, () => rows(1000, 1000, topic));
        const walMessages = mode === 'walmsg';
        if (walMessages) {
          // A message needs a registered reader: a slot of its own for the inserts alone, dropped after.
          await sql`SELECT pg_create_logical_replication_slot('bench_inserts_alone', 'pgoutput')`.execute(db);
          await sql`INSERT INTO outbox_wal_reader (slot_name, timeline)
            VALUES ('bench_inserts_alone', substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))`.execute(db);
        }
        const insertOnly = await cpuDuring(cpuSrc, async () => {
          for (const b of batches) await insertRows(db, b, walMessages);
        });
        if (walMessages) {
          await sql`DELETE FROM outbox_wal_reader WHERE slot_name = 'bench_inserts_alone'`.execute(db);
          await sql`SELECT pg_drop_replication_slot('bench_inserts_alone')`.execute(db);
        }
        await db.deleteFrom('outbox').execute();
        await sql`VACUUM outbox`.execute(db);

        const relay = createRelay({
          ...relayOptions,
          db,
          publisher: createKafkaPublisher({ brokers, client }),
        });
        const running = relay.run();
        const ready = () =>
          relay.stats().lanesOwned === 32 &&
          (mode === 'poll' || (relay.stats().wal?.streaming === true && relay.stats().wal?.heldLanes === 0));
        while (!ready()) await new Promise((r) => setTimeout(r, 20));
        const fresh = Array.from({ length: batches.length }, () => rows(1000, 1000, topic));
        const burst = await cpuDuring(cpuSrc, async () => {
          for (const b of fresh) await insertRows(db, b, walMessages);
          while (relay.stats().published < n) await new Promise((r) => setTimeout(r, 5));
          while ((await outboxCount(db)) > 0) await new Promise((r) => setTimeout(r, 20));
        });
        const streamed = relay.stats().wal?.streamed ?? 0;
        if (mode !== 'poll') restartPoint[combo] = await advanceRestartPoint(server, name);
        await relay.stop();
        await running;

        // A backlog drained by a relay started on it, and the same messages through this
        // client's own Publisher with no Postgres, `pairs` times in turn: each drain is compared
        // with the Publisher run beside it (a few seconds apart), so the machine's drift between
        // them, which moved a Publisher's run by a third, falls out of the ratio. Every other
        // pair runs the Publisher first: what one run leaves the next (the broker flushing the
        // log just written, a collection due) does not always fall on the same side.
        const rawTopic = `bench.modes.raw.${mode}.${client}.${Date.now()}`;
        topics.push(rawTopic);
        await createTopicsAndWait(admin, [{ topic: rawTopic, numPartitions: 6 }]);
        // Through this client's Publisher, or `publisher` (instantPublisher: the relay's own work).
        const drainWith = (publisher?: Publisher) =>
          drainBacklog({
            db,
            topic,
            n,
            walMessages,
            relay: relayOptions,
            brokers,
            client,
            cpu: cpuSrc,
            ...(publisher && { publisher }),
            // The next drain's relay must not decode this one's WAL again (advanceRestartPoint).
            ...(mode !== 'poll' && { beforeStop: () => advanceRestartPoint(server, name) }),
          });
        const pairs: Array<{ drain: DrainRun; raw: RawPublisherRun }> = [];
        for (let p = 0; p < pairCount; p++) {
          const publish = () =>
            rawPublisher({ brokers, client, topic: rawTopic, n, batch: 2500, cpu: cpuSrc, runs: 1 });
          const before = p % 2 === 1 ? await publish() : undefined;
          const d = await drainWith();
          pairs.push({ drain: d, raw: before ?? (await publish()) });
        }
        // The relay's own share: the same drain, every batch acknowledged at once, nothing sent.
        const own = await drainWith(instantPublisher);
        const drain = medianOf(pairs, (x) => x.drain.seconds).drain;
        rawRuns[client] = [...(rawRuns[client] ?? []), ...pairs.map((x) => x.raw)];

        const steady = (rate: number) =>
          commitToAck({
            db,
            brokers,
            topic,
            rate,
            seconds: steadySeconds,
            relay: relayOptions,
            cpu: cpuSrc,
            client,
            walMessages,
          });
        const at1k = await steady(1000);
        const at5k = await steady(5000);
        await db.destroy();

        const cpu: Record<string, CpuPerMsg> = {
          drain: cpuPerMsg(drain.cpu, n),
          drain_no_broker: cpuPerMsg(own.cpu, n),
          burst_inserts_and_relay: cpuPerMsg(burst.cpu, n),
          inserts_alone: cpuPerMsg(insertOnly.cpu, n),
          burst_relay_alone: cpuPerMsg(minus(burst.cpu, insertOnly.cpu), n),
          steady_1k: cpuPerMsg(at1k.cpu, at1k.sent),
          steady_5k: cpuPerMsg(at5k.cpu, at5k.sent),
        };
        console.log(`\n== ${MODE_NAMES[mode]} mode, ${client}, ${n} x 200 B`);
        console.log(
          `burst: ${(n / burst.seconds).toFixed(0)} msgs/s committed and published (inserts alone ${(n / insertOnly.seconds).toFixed(0)}/s)` +
            (mode !== 'poll'
              ? `; ${streamed} taken from the stream; the slot's restart point ${restartPoint[combo]}`
              : ''),
        );
        for (const [k, { drain: d, raw: r }] of pairs.entries()) {
          console.log(
            `drain ${k + 1} of a ${n} backlog: ${(n / d.seconds).toFixed(0)} msgs/s (after its first ack ${d.afterFirstAck.toFixed(0)}/s, ` +
              `the first ${d.firstCount} acked ${d.firstAckS.toFixed(2)} s in; ${Math.round(n / d.batches)} per batch); the Publisher ${k % 2 === 1 ? 'before' : 'after'} it ${r.msgs_per_s}/s ` +
              `(${r.after_first_ack_msgs_per_s}/s after its first ack): x ${(n / d.seconds / r.msgs_per_s).toFixed(2)} ` +
              `(${(d.afterFirstAck / r.after_first_ack_msgs_per_s).toFixed(2)}); Node's event loop busy ${d.loopBusy.toFixed(2)} ` +
              `of the drain, ${r.loop_busy} of the Publisher's run`,
          );
        }
        console.log(`  the median drain: ${cpuLine(cpu.drain!)}`);
        console.log(
          `  the same drain acknowledged at once, nothing sent (the relay's own work): ${(n / own.seconds).toFixed(0)} msgs/s; ${cpuLine(cpu.drain_no_broker!)}`,
        );
        console.log(`  inserts + relay   ${cpuLine(cpu.burst_inserts_and_relay!)}`);
        console.log(`  inserts alone     ${cpuLine(cpu.inserts_alone!)}`);
        console.log(`  relay alone       ${cpuLine(cpu.burst_relay_alone!)}`);
        for (const [s, c] of [
          [at1k, cpu.steady_1k!],
          [at5k, cpu.steady_5k!],
        ] as const) {
          console.log(
            `steady ${s.rate}/s (achieved ${s.achieved.toFixed(0)}/s): commit->ack p50 ${s.p50.toFixed(1)} ms, p99 ${s.p99.toFixed(1)} ms; ${cpuLine(c)}`,
          );
        }
        results[combo] = {
          drain_msgs_per_s: Math.round(n / drain.seconds),
          drain_after_first_ack_msgs_per_s: Math.round(drain.afterFirstAck),
          // Each drain against the Publisher run beside it: the median of those ratios.
          drain_ratio_to_raw_publisher: median(pairs.map((x) => n / x.drain.seconds / x.raw.msgs_per_s)),
          drain_after_first_ack_ratio: median(
            pairs.map((x) => x.drain.afterFirstAck / x.raw.after_first_ack_msgs_per_s),
          ),
          pairs: pairs.map((x) => ({
            drain_msgs_per_s: Math.round(n / x.drain.seconds),
            raw_publisher_msgs_per_s: x.raw.msgs_per_s,
            drain_loop_busy: Number(x.drain.loopBusy.toFixed(2)),
            raw_publisher_loop_busy: x.raw.loop_busy,
          })),
          drain_no_broker_msgs_per_s: Math.round(n / own.seconds),
          burst_msgs_per_s: Math.round(n / burst.seconds),
          streamed,
          p50_ms_at_1k: Number(at1k.p50.toFixed(2)),
          p99_ms_at_1k: Number(at1k.p99.toFixed(2)),
          p50_ms_at_5k: Number(at5k.p50.toFixed(2)),
          p99_ms_at_5k: Number(at5k.p99.toFixed(2)),
          cpu_by_phase: cpu,
        };
      }
    const raw: Record<string, RawPublisherRun> = {};
    for (const [client, runs] of Object.entries(rawRuns)) {
      const mid = medianOf(runs, (r) => r.msgs_per_s);
      raw[client] = { ...mid, runs: runs.map((r) => r.msgs_per_s) };
      console.log(
        `raw ${client} Publisher, no Postgres: ${mid.msgs_per_s} msgs/s (median of ${raw[client]!.runs.join(', ')}); ${cpuLine(mid.cpu)}`,
      );
    }
    console.log(
      '\nmode/client            drain msgs/s (x raw)  after 1st ack (x raw)  drain CPU µs/msg (Node, PG, broker)  relay alone in a burst  p50/p99 ms at 1k  at 5k',
    );
    for (const [combo, r] of Object.entries(results) as Array<[string, ModeResult]>) {
      const cpuText = (c: CpuPerMsg) => {
        const p = c.cpu_us_per_msg_by_process;
        return `${c.cpu_us_per_msg} (${p.node}, ${p.postgres}, ${p.broker})`;
      };
      console.log(
        `${combo.padEnd(22)} ${`${r.drain_msgs_per_s} (${r.drain_ratio_to_raw_publisher})`.padEnd(21)} ` +
          `${`${r.drain_after_first_ack_msgs_per_s} (${r.drain_after_first_ack_ratio})`.padEnd(22)} ` +
          `${cpuText(r.cpu_by_phase.drain!).padEnd(36)} ${cpuText(r.cpu_by_phase.burst_relay_alone!).padEnd(23)} ` +
          `${r.p50_ms_at_1k}/${r.p99_ms_at_1k}  ${r.p50_ms_at_5k}/${r.p99_ms_at_5k}`,
      );
    }
    return { bench: 'relay', modes: results, raw_publisher: raw, messages: n };
  } finally {
    await admin.deleteTopics({ topics }).catch(() => {});
    await admin.disconnect();
    await server.stop();
    rmSync(root, { recursive: true, force: true });
    await stack.stop();
  }
}
