import { Gauge, Histogram, Registry } from 'prom-client';
import type { Db } from '../src/db/database.js';
import type { KafkaAdmin } from '../src/kafka/admin.js';
import { observationsOf } from '../src/metrics/observations.js';
import { totalCounter } from '../src/metrics/totalCounter.js';
import type { InboxConsumer } from './inboxConsumer.js';
import type { InboxObservation } from './processSpan.js';

/**
 * An inbox consumer's Prometheus metrics: applied, duplicates skipped, stale refused, dead
 * letters (from its counters), dead letters on record and consumer lag (read at scrape time).
 */
export function inboxMetrics(
  consumer: InboxConsumer,
  opts: { db: Db; groupId: string; topics: string[]; admin?: KafkaAdmin },
): Registry {
  const registry = new Registry();
  const counter = (name: string, help: string, read: () => number) =>
    totalCounter(registry, { name, help, read, labels: { group: opts.groupId } });
  counter(
    'cairn_inbox_applied_total',
    'Messages applied (handler ran, inbox row written)',
    () => consumer.stats().applied,
  );
  counter(
    'cairn_inbox_duplicates_total',
    'Messages skipped as already applied',
    () => consumer.stats().duplicates,
  );
  counter(
    'cairn_inbox_stale_total',
    'Messages refused as older than the applied version',
    () => consumer.stats().stale,
  );
  counter(
    'cairn_inbox_dead_lettered_total',
    'Messages sent to the dead-letter topic',
    () => consumer.stats().deadLettered,
  );
  new Gauge({
    name: 'cairn_inbox_waiting_for',
    help: '1 while the consumer waits for a dependency that does not answer (postgres, kafka, or dependency: one its handler needs, such as a key provider)',
    labelNames: ['group', 'dependency'],
    registers: [registry],
    collect() {
      const waiting = consumer.waitingFor();
      for (const dependency of ['postgres', 'kafka', 'dependency'] as const) {
        this.set({ group: opts.groupId, dependency }, waiting === dependency ? 1 : 0);
      }
    },
  });
  new Gauge({
    name: 'cairn_inbox_dlq_open',
    help: 'Dead letters on record not yet replayed',
    labelNames: ['group'],
    registers: [registry],
    async collect() {
      // While Postgres is down the scrape must still answer (with cairn_inbox_waiting_for):
      // this gauge keeps its last value.
      const r = await opts.db
        .selectFrom('inbox_dlq')
        .select((eb) => eb.fn.countAll<number>().as('n'))
        .where('consumer_group', '=', opts.groupId)
        .where('replayed_at', 'is', null)
        .executeTakeFirst()
        .catch(() => undefined);
      if (r) this.set({ group: opts.groupId }, Number(r.n));
    },
  });
  const publishToApply = new Histogram({
    name: 'cairn_inbox_publish_to_apply_seconds',
    help: "From the Kafka record's timestamp to its handler's completion (its transaction commits next)",
    labelNames: ['group'],
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
    registers: [registry],
  });
  observationsOf<InboxObservation>(consumer)?.subscribe((o) =>
    publishToApply.observe({ group: opts.groupId }, o.publishToApplySeconds),
  );
  if (opts.admin) {
    const admin = opts.admin;
    new Gauge({
      name: 'cairn_inbox_lag',
      help: 'Messages not yet committed by the group (log end offset minus committed offset)',
      labelNames: ['group', 'topic'],
      registers: [registry],
      async collect() {
        const committed = await admin.committedOffsets(opts.groupId, opts.topics);
        for (const t of committed) {
          const ends = await admin.topicOffsets(t.topic);
          let lag = 0;
          for (const p of t.partitions) {
            const end = Number(ends.find((e) => e.partition === p.partition)?.high ?? 0);
            // -1 means the group has committed nothing on this partition yet.
            lag += Math.max(0, end - Math.max(0, Number(p.offset)));
          }
          this.set({ group: opts.groupId, topic: t.topic }, lag);
        }
      },
    });
  }
  return registry;
}
