import { Gauge, Registry } from 'prom-client';
import type { Db } from '../src/db/database.js';
import { totalCounter } from '../src/metrics/totalCounter.js';
import { outboxStatus } from '../src/outbox/status.js';
import type { Relay } from './relay.js';

/** The relay's Prometheus metrics; database-backed gauges are read at scrape time. */
export function relayMetrics(relay: Relay, db: Db): Registry {
  const registry = new Registry();
  const counter = (name: string, help: string, read: () => number) =>
    totalCounter(registry, { name, help, read });
  counter('cairn_relay_published_total', 'Messages the broker acknowledged', () => relay.stats().published);
  counter('cairn_relay_publish_retries_total', 'Publish attempts retried', () => relay.stats().retries);
  counter(
    'cairn_relay_lost_lane_deletes_total',
    'Published rows not deleted because the lane was lost (republished by the new owner)',
    () => relay.stats().lostLaneDeletes,
  );
  new Gauge({
    name: 'cairn_relay_lanes_owned',
    help: 'Outbox lanes this relay owns',
    registers: [registry],
    collect() {
      this.set(relay.stats().lanesOwned);
    },
  });
  new Gauge({
    name: 'cairn_relay_waiting_for',
    help: '1 while the relay waits at start for a dependency (postgres, kafka) that does not answer',
    labelNames: ['dependency'],
    registers: [registry],
    collect() {
      const waiting = relay.stats().waitingFor;
      for (const dependency of ['postgres', 'kafka'] as const)
        this.set({ dependency }, waiting === dependency ? 1 : 0);
    },
  });
  let status: Awaited<ReturnType<typeof outboxStatus>> | undefined;
  new Gauge({
    name: 'cairn_outbox_backlog',
    help: 'Messages waiting in the outbox',
    registers: [registry],
    async collect() {
      // While Postgres is down the scrape must still answer (with cairn_relay_waiting_for):
      // the outbox gauges keep their last values.
      status = (await outboxStatus(db).catch(() => undefined)) ?? status;
      if (status) this.set(status.backlog);
    },
  });
  new Gauge({
    name: 'cairn_outbox_oldest_unpublished_seconds',
    help: 'Age of the oldest message waiting in the outbox',
    registers: [registry],
    collect() {
      this.set(status?.oldest_unpublished_seconds ?? 0);
    },
  });
  new Gauge({
    name: 'cairn_outbox_parked_keys',
    help: 'Keys held back by a message the broker refused',
    registers: [registry],
    collect() {
      this.set(status?.parked_keys ?? 0);
    },
  });
  return registry;
}
