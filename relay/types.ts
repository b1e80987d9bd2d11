import type { Db } from '../src/db/database.js';
import type { KafkaAdmin } from '../src/kafka/admin.js';
import type { Publisher } from '../src/kafka/publisher.js';
import type { Logger } from '../src/logger.js';

/** What createRelay takes. */
export interface RelayOptions {
  db: Db;
  publisher: Publisher;
  /**
   * Asked which topics the cluster has when a batch fails for a topic the broker does not have
   * (createKafkaAdmin, the same brokers; the caller closes it). With it, a message to a missing
   * topic parks its own key even when every message of the batch is for that topic; without
   * it, only once another topic of the batch went through.
   */
  admin?: KafkaAdmin;
  logger?: Logger;
  instanceId?: string;
  /** Messages per batch at most (default 2,500). */
  batchSize?: number;
  /**
   * Payload bytes per batch at most (default 1 MiB); a single larger message still goes alone.
   * Keeps memory and produce requests bounded when messages are large.
   */
  maxBatchBytes?: number;
  /** Lane lease time to live; a dead relay's lanes are taken over after this. */
  leaseTtlMs?: number;
  /** Longest sleep when the outbox is empty (adaptive polling backs off up to this). */
  maxIdleMs?: number;
  /**
   * Run `VACUUM outbox` after this many deletes (0: never; leave it to autovacuum). A queue
   * table churns faster than autovacuum's one-minute nap: measured here, 287k dead tuples and
   * 163 MiB after 290k messages in one minute without it. Needs the table owner's rights.
   */
  vacuumEveryDeletes?: number;
  /**
   * A connection string: LISTEN on `cairn_outbox` with a dedicated connection and wake up at
   * once when an outbox with `notify: true` commits, instead of waiting for the next poll.
   * Polling goes on underneath (maxIdleMs), so a lost notification only costs latency.
   */
  wakeOnNotify?: string;
  /**
   * 'auto' (default): when commits wait for a synchronous standby, each batch is published
   * only after a write of the relay's own has committed (and so has replicated everything it
   * read, including a commit whose own wait for the standby was cancelled). 'off': never.
   */
  replicationBarrier?: 'auto' | 'off';
  /** Attempts for a retriable publish error (broker down, no leader) before the batch is retried from scratch. */
  publishRetries?: number;
  /**
   * The WAL mode: learn of new rows from a logical replication slot (pgoutput) instead of
   * polling the table. Needs `wal_level = logical` and a role with REPLICATION (docs/relay-modes.md).
   * Rows still leave the table only after the broker's ack, and the table is swept for what the
   * stream leaves to it; several relays share the lanes as in the polling mode, one streams the slot.
   */
  wal?: RelayWalOptions;
}

/** What the WAL mode needs (see RelayOptions.wal). */
export interface RelayWalOptions {
  /** A connection string for the replication connection (the same database as `db`). */
  connectionString: string;
  /** The logical replication slot (default `cairn_relay`): created when missing. */
  slot?: string;
  /** The publication of the outbox's inserts (default `cairn_outbox`): created when missing. */
  publication?: string;
  /** How often the table is swept for rows the stream left to it (default 1,000 ms). */
  sweepEveryMs?: number;
}

/**
 * Named points where a crash or interleaving test kills or pauses the relay. Internal: no
 * entry point exports it; tests reach it through `createRelayWithTestHooks`.
 */
export interface RelayTestHooks {
  /** After the broker acked a batch, before its rows are deleted (may pause the relay here). */
  afterPublish?(batchNumber: number, messageIds: readonly string[]): void | Promise<void>;
  /** Before each single-message publish while a refused batch is searched for its culprit. */
  beforeIsolatedPublish?(messageId: string): void | Promise<void>;
  /** Before a key is parked at the message (a row that cannot be encoded, a refusal, a missing topic). */
  beforePark?(messageId: string): void | Promise<void>;
}

/** Counters of a running relay (for metrics and tests). */
export interface RelayStats {
  published: number;
  batches: number;
  retries: number;
  parked: number;
  lanesOwned: number;
  lostLaneDeletes: number;
  /** Published rows already gone when the relay deleted them: `cairn outbox skip`, or a tenant's own DELETE. */
  goneBeforeDelete: number;
  /** Claims of the polling loop (each a query, with rows or not). */
  claims: number;
  /** The current idle sleep of adaptive polling, in ms (1 while busy). */
  idleMs: number;
  /**
   * Times this relay gave its lanes (and its WAL stream) to the other live relays because no
   * batch had reached the broker for twice the lease TTL (a broker it alone cannot reach).
   */
  steppedAside: number;
  /** Where the loop waited, in ms: for claimed rows, for the broker's ack, for the previous delete. */
  waitMs: { claim: number; publish: number; delete: number; barrier: number };
  /** At start: the dependency that has not answered yet (the relay waits for it); null once both did. */
  waitingFor: 'postgres' | 'kafka' | null;
  /** The WAL mode only. */
  wal?: {
    /** The replication slot. */
    slot: string;
    /** Whether this relay streams the slot now (else it reads the table, like the polling mode). */
    streaming: boolean;
    /** Rows taken from the stream (published, or left to the table's sweep). */
    streamed: number;
    /** Where this relay last confirmed the slot to. */
    confirmedLsn: string | null;
    /** Lanes and keys whose streamed rows wait for the sweep (see relay/wal/walRouting.ts). */
    heldLanes: number;
    heldKeys: number;
    /** Whether outbox messages written to the WAL only (migration 0019) are read: this relay's role reads the outbox's message secret. */
    readsMessages: boolean;
    /** WAL messages under the outbox's prefix without its secret: not published (a role calling pg_logical_emit_message itself). */
    forgedMessages: number;
    /** WAL messages this relay wrote into the table to wait there (a key parked, a lane held or another relay's). */
    movedToTable: number;
    /** Times the slot that read WAL messages was found lost (a promotion, an invalidation, a drop): messages not yet acknowledged then are lost. */
    messagesMaybeLost: number;
  };
}

/** A new relay's counters. */
export function newRelayStats(): RelayStats {
  return {
    published: 0,
    batches: 0,
    retries: 0,
    parked: 0,
    lanesOwned: 0,
    lostLaneDeletes: 0,
    goneBeforeDelete: 0,
    steppedAside: 0,
    claims: 0,
    idleMs: 1,
    waitMs: { claim: 0, publish: 0, delete: 0, barrier: 0 },
    waitingFor: null,
  };
}

/** Adds the time each awaited step took to `stats.waitMs[what]`. */
export function waitTimer(stats: RelayStats) {
  return async <T>(what: keyof RelayStats['waitMs'], p: Promise<T>): Promise<T> => {
    const t0 = performance.now();
    try {
      return await p;
    } finally {
      stats.waitMs[what] += performance.now() - t0;
    }
  };
}

/**
 * Publishes the outbox to Kafka in order per key, sharing lanes with the other relays;
 * `stop()` releases them.
 */
export interface Relay {
  readonly instanceId: string;
  /**
   * Runs until stop(); resolves when the loop has finished its batch in flight and released its
   * lanes. At start it waits for Postgres, then for the broker (capped backoff, logged with the
   * address); a configuration error (credentials refused, no such database) rejects it.
   */
  run(): Promise<void>;
  /**
   * Stops after the batch in flight; resolves once the lanes are released and the publisher
   * disconnected.
   */
  stop(): Promise<void>;
  /** A copy of the counters now. */
  stats(): RelayStats;
}
