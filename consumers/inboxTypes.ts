import type { Transaction } from 'kysely';
import type { Db } from '../src/db/database.js';
import type { Database } from '../src/db/types.js';
import type { Publisher } from '../src/kafka/publisher.js';
import type { Subscriber } from '../src/kafka/subscriber.js';
import type { Logger } from '../src/logger.js';
import type { Dependency } from '../src/startup/untilReachable.js';
import type { DeadlineHooks } from './handlerDeadline.js';
import type { InboxMessage } from './inboxMessage.js';

/** The inbox consumer's public types (createInboxConsumer is in inboxConsumer.ts). */

/**
 * Runs inside the transaction that also records the message as applied: write your effects
 * with `trx`. A throw rolls them back; the message is tried again (`maxAttempts`, with
 * backoff) unless the error's `retriable` is `false` (a `ValidationError`, say, or your own
 * error with `retriable: false`), which sends it to the dead-letter topic at once.
 */
export type InboxHandler<Tables extends AppTables = NoTables> = (
  trx: Transaction<Database & Tables>,
  message: InboxMessage,
) => Promise<void>;

/** No tables of the application's: a handler's transaction then sees Cairn's tables only. */
export type NoTables = Record<never, never>;

/**
 * The application's tables a handler may name: none called like one of Cairn's, since on
 * Cairn's connections an unqualified name finds Cairn's table first (its schema leads the
 * search_path). Name such a table with its schema (`public.outbox`) in raw SQL instead.
 */
export type AppTables = object;

/** Compiles only when none of `Tables` is named like one of Cairn's tables. */
export type NoCairnNames<Tables> = [keyof Tables & keyof Database] extends [never]
  ? unknown
  : {
      "tables named like Cairn's (qualify them with their schema in SQL instead)": keyof Tables &
        keyof Database;
    };

/**
 * What createInboxConsumer takes. `Tables` are the application's own tables as kysely sees
 * them (a type, not an interface), so the handler writes them typed in its transaction.
 */
export interface InboxConsumerOptions<Tables extends AppTables = NoTables> {
  db: Db;
  subscriber: Subscriber;
  /** Publishes dead letters to `<topic>.dlq`. */
  dlqPublisher: Publisher;
  groupId: string;
  handler: InboxHandler<Tables>;
  logger?: Logger;
  /**
   * Messages per database transaction (a Kafka batch is cut into chunks). Default: as many as fit
   * into about a second at the previous transaction's pace, up to 5,000 (consumers/chunkSize.ts).
   */
  chunkSize?: number;
  /** Attempts for a failing message before it goes to the dead-letter topic. */
  maxAttempts?: number;
  retryBaseMs?: number;
  /** Longest wait between two attempts of one message. Default 5 s. */
  retryMaxMs?: number;
  /**
   * The longest a transaction of handlers may run (a chunk of messages, or one alone). Past
   * it, the transaction's own Postgres session is ended, so nothing of it commits and nothing
   * the handler sends through `trx` later lands anywhere; the message is tried again (an
   * attempt) and dead-lettered after `maxAttempts`. Default 5 minutes. What the handler does
   * outside the database after that still happens (JavaScript cannot be stopped): effects on
   * other services belong behind tool receipts. consumers/handlerDeadline.ts.
   */
  handlerTimeoutMs?: number;
  /** Refuse a message whose task version is not newer than the newest applied for its key. */
  refuseStaleVersions?: boolean;
  /** This group's inbox rows older than this are pruned; must exceed the topics' retention. Default 7 days. */
  retentionMs?: number;
  pruneEveryMs?: number;
  /**
   * Called after each transaction the consumer commits, with what it applied and what it
   * dropped as a duplicate or a stale version (to count or record them; `stats()` has the
   * totals). It runs after the commit, so it cannot undo anything; an error it throws is
   * logged and ignored.
   */
  onCommitted?(counts: InboxCommitCounts): void;
}

/** What one committed transaction of an inbox consumer applied and dropped. */
export interface InboxCommitCounts {
  /** Messages whose handler ran and committed. */
  applied: number;
  /** Messages already in the inbox (a redelivery, or a second copy): dropped. */
  duplicates: number;
  /** Messages refused by `refuseStaleVersions` (not newer than the key's newest applied): dropped. */
  stale: number;
}

/**
 * A named point where a crash test kills the consumer. Internal: no entry point exports it;
 * tests reach it through `createInboxConsumerWithTestHooks`.
 */
export interface InboxTestHooks extends DeadlineHooks {
  /** After each database commit, before the offset commit; `commits` counts them from 1. */
  afterDbCommit?(commits: number): void;
}

/** Counters of a running inbox consumer (for metrics and tests). */
export interface InboxStats {
  applied: number;
  duplicates: number;
  stale: number;
  deadLettered: number;
  retries: number;
  commits: number;
  offsetCommitFailures: number;
}

/**
 * Applies each message once, in the handler's transaction, and commits offsets only after
 * that transaction did.
 */
export interface InboxConsumer {
  /**
   * Resolves once consuming has started. It first waits for Postgres, then for the broker
   * (capped backoff, logged with the address); a configuration error is thrown.
   */
  run(): Promise<void>;
  /**
   * Stops consuming, leaves the group and disconnects the dead-letter publisher; a run()
   * waiting for a dependency returns.
   */
  stop(): Promise<void>;
  /** A copy of the counters now. */
  stats(): InboxStats;
  /**
   * What the consumer waits for because it does not answer: Postgres or the broker (at start,
   * or Postgres gone while running), or `'dependency'` while a batch waits for another one its
   * handler needs (a key provider that fails: an `UnavailableError`); null when nothing is
   * waited for (or before run()).
   */
  waitingFor(): Dependency | 'dependency' | null;
}
