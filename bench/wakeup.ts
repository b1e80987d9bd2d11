/**
 * How the relay wakes up: adaptive polling (fast, and the default 200 ms ceiling) against
 * LISTEN/NOTIFY, at a steady 1,000 messages/s (commit to broker ack), and what a NOTIFY in
 * every transaction costs commit throughput (single-row transactions, 4 writers).
 */
import { sql } from 'kysely';
import { kafkaClient } from '../src/kafka/publisher.js';
import { OUTBOX_CHANNEL } from '../src/outbox/outbox.js';
import { commitToAck } from './commitToAck.js';
import { insertRows, rows } from './outboxRows.js';
import { benchDatabase, flag, throughput } from './support.js';

export async function benchWakeup(args: string[]): Promise<Record<string, unknown>> {
  const seconds = flag(args, 'seconds', args.includes('--quick') ? 4 : 10);
  const env = await benchDatabase('wakeup', 10);
  const brokers = env.stack.kafkaBrokers.split(',');
  const topic = `bench.wakeup.${Date.now()}`;
  const admin = kafkaClient(brokers, 'bench-wakeup').admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 3 }], waitForLeaders: true });
  try {
    const run = (mode: 'poll-5ms' | 'poll-200ms' | 'notify') =>
      commitToAck({
        db: env.db,
        brokers,
        topic,
        rate: 1000,
        seconds,
        notify: mode === 'notify',
        relay: {
          maxIdleMs: mode === 'poll-5ms' ? 5 : mode === 'poll-200ms' ? 200 : 1000,
          ...(mode === 'notify' ? { wakeOnNotify: env.url } : {}),
        },
      });
    const fast = await run('poll-5ms');
    const slow = await run('poll-200ms');
    const notify = await run('notify');

    // Commit throughput, single-row transactions, with and without a NOTIFY in each.
    const one = async (withNotify: boolean) =>
      throughput(4, seconds / 2, async () => {
        await env.db.transaction().execute(async (trx) => {
          await insertRows(trx, rows(1, 1000, 'bench.unpublished'));
          if (withNotify) await sql`SELECT pg_notify(${OUTBOX_CHANNEL}, '')`.execute(trx);
        });
      });
    await sql`DELETE FROM relay_lane`.execute(env.db); // nobody relays these rows
    const plain = await one(false);
    const notified = await one(true);

    const f = (x: number) => x.toFixed(1).padStart(6);
    console.log(`steady 1,000 msgs/s for ${seconds} s, commit -> broker ack:`);
    console.log(`  adaptive polling, max idle 5 ms     p50 ${f(fast.p50)} ms   p99 ${f(fast.p99)} ms`);
    console.log(`  adaptive polling, max idle 200 ms   p50 ${f(slow.p50)} ms   p99 ${f(slow.p99)} ms`);
    console.log(`  LISTEN/NOTIFY (poll at 1 s)         p50 ${f(notify.p50)} ms   p99 ${f(notify.p99)} ms`);
    console.log(
      `single-row commits, 4 writers: ${plain.toFixed(0)}/s without NOTIFY, ${notified.toFixed(0)}/s with (${((notified / plain - 1) * 100).toFixed(0)}%)`,
    );
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
    };
  } finally {
    await admin.deleteTopics({ topics: [topic] }).catch(() => {});
    await admin.disconnect();
    await env.close();
  }
}
