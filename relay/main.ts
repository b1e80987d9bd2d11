/**
 * The relay as a process (`cairn relay`, or `tsx relay/main.ts`). Configuration from the
 * environment: DATABASE_URL, KAFKA_BROKERS, CAIRN_RELAY_INSTANCE, CAIRN_RELAY_BATCH,
 * CAIRN_RELAY_LEASE_TTL_MS, CAIRN_RELAY_MAX_IDLE_MS, CAIRN_RELAY_REPLICATION_BARRIER (auto|off),
 * CAIRN_RELAY_MODE (poll, the default, or wal: new rows from a logical replication slot on
 * DATABASE_URL, named by CAIRN_RELAY_WAL_SLOT, default cairn_relay; docs/relay-modes.md),
 * CAIRN_METRICS_PORT (serves /metrics, /healthz, /readyz when set) on CAIRN_METRICS_HOST
 * (default 127.0.0.1). SIGTERM/SIGINT finish the batch in flight, release the lanes and exit 0.
 *
 * Started while Postgres or the broker is down, it waits for them (logged with the address,
 * /readyz 503, cairn_relay_waiting_for 1) and starts publishing once they answer. It exits
 * with ExitCode.configuration (78) on a configuration error: a malformed DATABASE_URL or
 * KAFKA_BROKERS, credentials refused, a database that does not exist, a metrics address it
 * cannot bind (the port taken).
 */
import { createDb } from '../src/db/database.js';
import { databaseUrlFromEnv, kafkaBrokersFromEnv } from '../src/env.js';
import { ConfigurationError } from '../src/errors.js';
import { exitCodeFor } from '../src/exitCodes.js';
import { createKafkaAdmin } from '../src/kafka/admin.js';
import { createKafkaPublisher } from '../src/kafka/publisher.js';
import { createLogger } from '../src/logger.js';
import { metricsAddressFromEnv, startMetricsServer } from '../src/metrics/metricsServer.js';
import { relayMetrics } from './metrics.js';
import { createRelayWithTestHooks } from './relay.js';

function killAfter(batch: number) {
  return (n: number) => {
    if (n >= batch) process.kill(process.pid, 'SIGKILL');
  };
}

function relayMode(): 'poll' | 'wal' {
  const mode = process.env.CAIRN_RELAY_MODE ?? 'poll';
  if (mode === 'poll' || mode === 'wal') return mode;
  throw new ConfigurationError(`CAIRN_RELAY_MODE is "${mode}": use poll (the default) or wal`);
}

let running: Promise<number> | undefined;

/**
 * Runs the relay process until SIGTERM; resolves with its exit code. Once per process: a
 * second call (a wrapper that imports this module, which a bundler may also run as the entry
 * point) gets the same run instead of a second relay under the same instance id.
 */
export function runRelayProcess(): Promise<number> {
  running ??= relayProcess();
  return running;
}

async function relayProcess(): Promise<number> {
  const logger = createLogger({ name: 'cairn-relay' });
  const metricsAddress = metricsAddressFromEnv();
  const db = createDb({ connectionString: databaseUrlFromEnv(), max: 4, applicationName: 'cairn-relay' });
  const num = (name: string) => (process.env[name] ? Number(process.env[name]) : undefined);
  // Crash tests: die by SIGKILL after the broker acked batch N and before its rows are deleted.
  const killAfterPublish = num('CAIRN_FAULT_KILL_AFTER_PUBLISH');
  // Asked only when a batch fails for a topic the broker lacks (RelayOptions.admin).
  const admin = createKafkaAdmin({ brokers: kafkaBrokersFromEnv(), clientId: 'cairn-relay-admin' });
  const relay = createRelayWithTestHooks(
    {
      db,
      publisher: createKafkaPublisher({ brokers: kafkaBrokersFromEnv() }),
      admin,
      logger,
      ...(process.env.CAIRN_RELAY_INSTANCE ? { instanceId: process.env.CAIRN_RELAY_INSTANCE } : {}),
      ...(num('CAIRN_RELAY_BATCH') ? { batchSize: num('CAIRN_RELAY_BATCH')! } : {}),
      ...(num('CAIRN_RELAY_LEASE_TTL_MS') ? { leaseTtlMs: num('CAIRN_RELAY_LEASE_TTL_MS')! } : {}),
      ...(num('CAIRN_RELAY_MAX_IDLE_MS') ? { maxIdleMs: num('CAIRN_RELAY_MAX_IDLE_MS')! } : {}),
      ...(process.env.CAIRN_RELAY_REPLICATION_BARRIER === 'off'
        ? { replicationBarrier: 'off' as const }
        : {}),
      ...(relayMode() === 'wal'
        ? {
            wal: {
              connectionString: databaseUrlFromEnv(),
              ...(process.env.CAIRN_RELAY_WAL_SLOT ? { slot: process.env.CAIRN_RELAY_WAL_SLOT } : {}),
            },
          }
        : {}),
    },
    killAfterPublish ? { afterPublish: killAfter(killAfterPublish) } : {},
  );
  const stop = () => {
    logger.info('stopping: finishing the batch in flight');
    void relay.stop();
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  logger.info({ instance: relay.instanceId }, 'relay started');
  let metrics: Awaited<ReturnType<typeof startMetricsServer>> | undefined;
  try {
    metrics = metricsAddress
      ? await startMetricsServer({
          registry: relayMetrics(relay, db),
          ...metricsAddress,
          ready: () => relay.stats().waitingFor === null && relay.stats().lanesOwned > 0,
        })
      : undefined;
  } catch (err) {
    await db.destroy(); // nothing else is open yet: the relay has not run
    throw err;
  }
  if (metrics)
    logger.info({ host: metrics.host, port: metrics.port }, 'metrics on /metrics, /healthz, /readyz');
  try {
    await relay.run();
  } finally {
    await metrics?.close();
    await admin.close().catch(() => {});
    await db.destroy();
  }
  logger.info(relay.stats(), 'relay stopped');
  return 0;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  runRelayProcess().then(
    (code) => process.exit(code),
    (err: unknown) => {
      process.stderr.write(`cairn relay: ${(err as Error).message}\n`);
      process.exit(exitCodeFor(err));
    },
  );
}
