import { type Db, databaseAddress, pingDatabase, pingWritable } from '../src/db/database.js';
import { isConfigurationSqlError, isConnectionLoss, SqlState, sqlState } from '../src/db/sqlstate.js';
import { CairnError, messageOf, UnavailableError } from '../src/errors.js';
import type { Logger } from '../src/logger.js';
import { untilReachable } from '../src/startup/untilReachable.js';
import type { DependencyWait } from './dependencyWait.js';
import type { BatchHeartbeat } from './heartbeat.js';

/** One onBatch call: what the messages of a batch share while it is applied. */
export interface BatchRun {
  isActive(): boolean;
  heartbeat: BatchHeartbeat;
  /** Its wait for a dependency other than Postgres, ended only by its own commits. */
  wait: DependencyWait;
}

/**
 * The inbox consumer's answer to "was that failure an outage?" (consumers/inboxConsumer.ts):
 * Postgres gone or read-only, or another dependency the handler needs (`dependencyBack`,
 * dependencyWait.ts), never the message's fault.
 */
export function outageJudge(o: {
  db: Db;
  log: Logger;
  /** stop(): ends any wait. */
  signal: AbortSignal;
  /** Another dependency the handler needs is down: waited for, per batch and bounded. `refused`: it answered, and said no. */
  dependencyBack(
    err: unknown,
    run: BatchRun,
    refused: boolean,
    answered?: boolean,
  ): Promise<'none' | 'waited' | 'stopped'>;
}) {
  const { db, log, dependencyBack } = o;
  let waitingForDb = false;
  /** Waits until Postgres answers (waitingFor() says 'postgres' meanwhile); 'stopped' if stop() ended the wait. */
  function databaseAnswers(ping = () => pingDatabase(db)): Promise<'reached' | 'stopped'> {
    return untilReachable(ping, {
      dependency: 'postgres',
      address: databaseAddress(db),
      logger: log,
      isConfigurationError: isConfigurationSqlError,
      signal: o.signal,
      onWaiting: (w) => {
        waitingForDb = w;
      },
    });
  }

  /**
   * After a failure: was it Postgres going away? An outage is never the message's fault: it
   * spends none of its attempts (a cut of a second spent them all, and the healthy message was
   * dead-lettered once Postgres answered again). A connection error while the database answers
   * at once (a handler's own call to another service, a pooled connection that died) is the
   * message's. 'waited': Postgres was down and answers again; 'stopped': stop() ended the wait.
   */
  async function outage(err: unknown, run: BatchRun): Promise<'none' | 'waited' | 'stopped'> {
    // A data key that does not unwrap under this process's keyring (key_unavailable) is waited
    // for like a key provider that does not answer: the same bound, the same evidence.
    if (err instanceof CairnError && (err.code === 'unavailable' || err.code === 'key_unavailable')) {
      return dependencyBack(err, run, err instanceof UnavailableError && err.refused);
    }
    const readOnly = sqlState(err) === SqlState.readOnlyTransaction;
    if (!isConnectionLoss(err) && !readOnly) return 'none';
    try {
      await (readOnly ? pingWritable : pingDatabase)(db);
      // Read-only a moment ago, writable now (a promotion just finished): not the message's,
      // waited for with backoff and a bound (a handler writing to another server that stays
      // read-only must neither spin nor hold the partition for good). Not a refusal given up
      // early while others are applied (a pooled connection still on the old primary during a
      // failover is waited for the whole bound); past the bound, the message's.
      return readOnly ? dependencyBack(err, run, false, true) : 'none';
    } catch {
      log.warn({ err: messageOf(err) }, 'postgres went away: waiting for it; no attempt is counted');
    }
    // A server that is read-only (a standby being promoted) is waited for until it takes writes.
    const back = await databaseAnswers(readOnly ? () => pingWritable(db) : undefined);
    return back === 'reached' ? 'waited' : 'stopped';
  }

  return { databaseAnswers, outage, waitingForDb: () => waitingForDb };
}
