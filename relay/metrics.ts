import { Counter, Gauge, Registry } from 'prom-client';
import type { Db } from '../src/db/database.js';
import { outboxStatus } from '../src/outbox/status.js';
import type { Relay } from './relay.js';

/** The relay's Prometheus metrics; database-backed gauges are read at scrape time. */
export function relayMetrics(relay: Relay, db: Db): Registry {
  const registry = new Registry();
  let last = relay.stats();
  const published = new Counter({
    name: 'cairn_relay_published_total',
    help: 'Messages the broker acknowledged',
    registers: [registry],
  });
  const retries = new Counter({
    name: 'cairn_relay_publish_retries_total',
    help: 'Publish attempts retried',
    registers: [registry],
  });
  const lostDeletes = new Counter({
    name: 'cairn_relay_lost_lane_deletes_total',
    help: 'Published rows not deleted because the lane was lost (republished by the new owner)',
    registers: [registry],
  });
  const sync = () => {
    const s = relay.stats();
    published.inc(s.published - last.published);
    retries.inc(s.retries - last.retries);
    lostDeletes.inc(s.lostLaneDeletes - last.lostLaneDeletes);
    last = s;
  };
  new Gauge({
    name: 'cairn_relay_lanes_owned',
    help: 'Outbox lanes this relay owns',
    registers: [registry],
    collect() {
      sync();
      this.set(relay.stats().lanesOwned);
    },
  });
  let status: Awaited<ReturnType<typeof outboxStatus>> | undefined;
  new Gauge({
    name: 'cairn_outbox_backlog',
    help: 'Messages waiting in the outbox',
    registers: [registry],
    async collect() {
      status = await outboxStatus(db);
      this.set(status.backlog);
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
