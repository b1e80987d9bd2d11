import { messageOf } from '../src/errors.js';
import type { ReceivedBatch } from '../src/kafka/subscriber.js';
import type { Logger } from '../src/logger.js';

/** A batch's heartbeat as the inbox consumer sends it. */
export interface BatchHeartbeat {
  /** Sends one if about a second passed since the last and none is on its way; never waits for it. */
  beat(): void;
  /** A heartbeat failed: the group is rebalancing (or the coordinator is gone); hand the batch back. */
  failed(): boolean;
}

/**
 * Heartbeats are never awaited: a coordinator that does not answer makes the client wait its
 * request timeout (15 s with kafkajs), and a chunk waiting for it would hold its Postgres
 * transaction open, with the inbox rows and every row its handlers wrote locked, while the
 * partition's next owner blocks on them. A failed heartbeat is how a member busy in a batch
 * learns that the group is rebalancing: the consumer then stops after the chunk it is in and
 * returns the batch, so the client rejoins instead of holding the whole group up until the
 * rebalance times out (the rest of the batch is read again, and the inbox skips what was applied).
 */
export function batchHeartbeat(batch: ReceivedBatch, log: Logger, everyMs = 1000): BatchHeartbeat {
  let dueAt = performance.now() + everyMs;
  let sending = false;
  let failed = false;
  return {
    beat() {
      if (sending || failed || performance.now() < dueAt) return;
      sending = true;
      dueAt = performance.now() + everyMs;
      batch
        .heartbeat()
        .catch((err: unknown) => {
          failed = true;
          log.info(
            { err: messageOf(err), partition: batch.partition },
            'heartbeat failed (rebalance?): handing the batch back after this chunk',
          );
        })
        .finally(() => {
          sending = false;
        });
    },
    failed: () => failed,
  };
}

/**
 * Runs a handler's call, offering the batch's heartbeat every 500 ms meanwhile: a handler
 * slower than the group's session timeout kept its partition only until the coordinator
 * dropped the member (kafkajs heartbeats only when asked); its offset commit then failed and
 * the batch came again as duplicates. (@platformatic/kafka and librdkafka heartbeat by themselves.)
 */
export async function beatingWhile<T>(
  heartbeat: BatchHeartbeat | undefined,
  call: () => Promise<T>,
  /** Aborted when the call is abandoned (its deadline passed): the beats stop, whether it ever returns or not. */
  abandoned?: AbortSignal,
): Promise<T> {
  if (!heartbeat) return call();
  const timer = setInterval(() => heartbeat.beat(), 500);
  const stop = () => clearInterval(timer);
  abandoned?.addEventListener('abort', stop, { once: true });
  try {
    return await call();
  } finally {
    stop();
    abandoned?.removeEventListener('abort', stop);
  }
}
