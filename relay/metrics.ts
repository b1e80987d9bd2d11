import { Gauge, Histogram, Registry } from 'prom-client';
import type { Db } from '../src/db/database.js';
import { observationsOf } from '../src/metrics/observations.js';
import { totalCounter } from '../src/metrics/totalCounter.js';
import { outboxStatus } from '../src/outbox/status.js';
import type { RelayObservation } from './publishSpan.js';
import type { Relay } from './relay.js';
import { slotLag } from './wal/walSetup.js';

/** Seconds from commit to the broker's ack: a relay keeping up is in the first buckets. */
export const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300];

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
  counter(
    'cairn_relay_gone_before_delete_total',
    'Published rows already gone from the outbox when the relay deleted them (skipped by an operator, or deleted by a tenant)',
    () => relay.stats().goneBeforeDelete,
  );
  counter(
    'cairn_relay_stepped_aside_total',
    'Times this relay gave its lanes to the other live relays because no batch reached the broker for twice the lease TTL',
    () => relay.stats().steppedAside,
  );
  counter(
    'cairn_relay_claims_total',
    'Claims of the polling loop (queries, with rows or not)',
    () => relay.stats().claims,
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
  if (relay.stats().wal) walGauges(registry, relay, db);
  const commitToPublish = new Histogram({
    name: 'cairn_relay_commit_to_publish_seconds',
    help: "From an outbox row's insert (database clock) to the broker's ack of its message",
    buckets: LATENCY_BUCKETS,
    registers: [registry],
  });
  const batchSize = new Histogram({
    name: 'cairn_relay_batch_size',
    help: 'Messages per batch the broker acknowledged',
    buckets: [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500],
    registers: [registry],
  });
  observationsOf<RelayObservation>(relay)?.subscribe((o) => {
    batchSize.observe(o.batchSize);
    for (const s of o.commitToPublishSeconds) commitToPublish.observe(s);
  });
  return registry;
}

/** The WAL mode's gauges: whether this relay streams the slot, and the WAL the slot holds. */
function walGauges(registry: Registry, relay: Relay, db: Db): void {
  new Gauge({
    name: 'cairn_relay_wal_streaming',
    help: '1 while this relay streams the replication slot (0: it reads the outbox table, as in the polling mode)',
    registers: [registry],
    collect() {
      this.set(relay.stats().wal?.streaming ? 1 : 0);
    },
  });
  new Gauge({
    name: 'cairn_relay_wal_slot_lag_bytes',
    help: "WAL the relay's replication slot holds on the server's disk (pg_current_wal_lsn() - confirmed_flush_lsn); grows without bound while no relay streams it",
    registers: [registry],
    async collect() {
      const slot = relay.stats().wal?.slot;
      const lag = slot ? await slotLag(db, slot).catch(() => undefined) : undefined;
      if (lag) this.set(lag.lagBytes);
    },
  });
}
