/**
 * How the relay wakes up: adaptive polling (fast, and the default 200 ms ceiling) against
 * LISTEN/NOTIFY, at a steady 1,000 messages/s (commit to broker ack), and what a NOTIFY in
 * every transaction costs commit throughput (single-row transactions, 4 writers). Each phase
 * also reports CPU µs per message (per commit) of Node, the database's backends and the broker.
 */
import { sql } from 'kysely';
import { createTopicsAndWait } from '../src/kafka/kafkajsAdmin.js';
import { kafkaClient } from '../src/kafka/publisher.js';
import { OUTBOX_CHANNEL } from '../src/outbox/outbox.js';
import { commitToAck } from './commitToAck.js';
import { type CpuSpent, cpuDuring, cpuLine, cpuPerMsg, cpuSources } from './cpu.js';
import { insertRows, rows } from './outboxRows.js';
import { benchDatabase, flag, throughput } from './support.js';

export async function benchWakeup(args: string[]): Promise<Record<string, unknown>> {
  const seconds = flag(args, 'seconds', args.includes('--quick') ? 4 : 10);
  const env = await benchDatabase('wakeup', 10);
  const brokers = env.stack.kafkaBrokers.split(',');
  const topic = `bench.wakeup.${Date.now()}`;
  const admin = kafkaClient(brokers, 'bench-wakeup').admin();
  await admin.connect();
  await createTopicsAndWait(admin, [{ topic, numPartitions: 3 }]);
  const cpuSrc = await cpuSources(env);
  try {
    const run = (mode: 'poll-5ms' | 'poll-200ms' | 'notify') =>
      commitToAck({
        db: env.db,
        brokers,
        topic,
        rate: 1000,
        seconds,
        notify: mode === 'notify',
        cpu: cpuSrc,
        relay: {
          maxIdleMs: mode === 'poll-5ms' ? 5 : mode === 'poll-200ms' ? 200 : 1000,
          ...(mode === 'notify' ? { wakeOnNotify: env.url } : {}),
        },
      });
    const fast = await run('poll-5ms');
    const slow = await run('poll-200ms');
    const notify = await run('notify');

    // Commit throughput, single-row transactions, with and without a NOTIFY in each.
    const one = async (withNotify: boolean) => {
      let commits = 0;
      const { result, cpu } = await cpuDuring(cpuSrc, () =>
        throughput(4, seconds / 2, async () => {
          await env.db.transaction().execute(async (trx) => {
            await insertRows(trx, rows(1, 1000, 'bench.unpublished'));
            if (withNotify) await sql`SELECT pg_notify(${OUTBOX_CHANNEL}, '')`.execute(trx);
          });
          commits++;
        }),
      );
      return { perS: result, cpu: cpuPerMsg(cpu, commits) };
    };
    await sql`DELETE FROM relay_lane`.execute(env.db); // nobody relays these rows
    const plainRun = await one(false);
    const notifiedRun = await one(true);
    const plain = plainRun.perS;
    const notified = notifiedRun.perS;
    const steadyCpu = (r: { cpu: CpuSpent; sent: number }) => cpuPerMsg(r.cpu, r.sent);
    const cpu = {
      poll5: steadyCpu(fast),
      poll200: steadyCpu(slow),
      notify: steadyCpu(notify),
      commits: plainRun.cpu,
      commits_with_notify: notifiedRun.cpu,
    };

    const f = (x: number) => x.toFixed(1).padStart(6);
    console.log(`steady 1,000 msgs/s for ${seconds} s, commit -> broker ack:`);
    console.log(`  adaptive polling, max idle 5 ms     p50 ${f(fast.p50)} ms   p99 ${f(fast.p99)} ms`);
    console.log(`    ${cpuLine(cpu.poll5)}`);
    console.log(`  adaptive polling, max idle 200 ms   p50 ${f(slow.p50)} ms   p99 ${f(slow.p99)} ms`);
    console.log(`    ${cpuLine(cpu.poll200)}`);
    console.log(`  LISTEN/NOTIFY (poll at 1 s)         p50 ${f(notify.p50)} ms   p99 ${f(notify.p99)} ms`);
    console.log(`    ${cpuLine(cpu.notify)}`);
    console.log(
      `single-row commits, 4 writers: ${plain.toFixed(0)}/s without NOTIFY, ${notified.toFixed(0)}/s with (${((notified / plain - 1) * 100).toFixed(0)}%)`,
    );
    console.log(`  without NOTIFY: ${cpuLine(cpu.commits, 'commit')}`);
    console.log(`  with NOTIFY:    ${cpuLine(cpu.commits_with_notify, 'commit')}`);
    console.log(`CPU: ${cpuSrc.brokerSource}; ${cpuSrc.postgresSource}`);
    return {
      bench: 'wakeup',
      poll5_p50_ms: Number(fast.p50.toFixed(2)),
      poll5_p99_ms: Number(fast.p99.toFixed(2)),
      poll200_p50_ms: Number(slow.p50.toFixed(2)),
      poll200_p99_ms: Number(slow.p99.toFixed(2)),
      notify_p50_ms: Number(notify.p50.toFixed(2)),
      notify_p99_ms: Number(notify.p99.toFixed(2)),
      commits_per_s: Math.round(plain),
      commits_per_s_with_notify: Math.round(notified),
      cpu_broker: cpuSrc.brokerSource,
      cpu_postgres: cpuSrc.postgresSource,
      cpu_by_phase: cpu,
    };
  } finally {
    await admin.deleteTopics({ topics: [topic] }).catch(() => {});
    await admin.disconnect();
    await env.close();
  }
}
