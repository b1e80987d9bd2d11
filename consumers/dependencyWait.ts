import { setTimeout as sleep } from 'node:timers/promises';
import { messageOf, UnavailableError } from '../src/errors.js';
import type { Logger } from '../src/logger.js';

/**
 * One batch's wait for a dependency other than Postgres: a key provider that fails
 * (UnavailableError), or a server that refused a handler's write as read-only though it takes
 * writes at the ping. Kept per batch (the subscriber runs batches of several partitions at
 * once) and ended only by a commit of that batch: another partition's commits say nothing of
 * what holds this one (reset by them, a refused key was waited for forever).
 */
export interface DependencyWait {
  /** Waits so far (the backoff's exponent); 0 when none is under way. */
  tries: number;
  /** When the first of them began (performance.now()). */
  since: number;
  /** The consumer's applied count when the wait began, or when it last gave a message up. */
  appliedBefore: number;
  /** What says the dependency works, counted: its own answers when it keeps count, else the consumer's applied messages. */
  evidence?: () => number;
}

/** How long a refusal given up is remembered: its subject's next refusals are given up at once. */
export const REFUSAL_MEMORY_MS = 10 * 60_000;
const REFUSALS_KEPT = 1000;

/**
 * 'wait': no attempt is counted. 'message': the failure is the message's (its attempts count,
 * then the dead-letter topic). 'outage': past the bound, but nothing says the dependency
 * works: the wait goes on.
 */
export type WaitStep = 'wait' | 'message' | 'outage';

export function dependencyWait(): DependencyWait {
  return { tries: 0, since: 0, appliedBefore: 0 };
}

/**
 * What to do about one more failure of the dependency. Within `boundMs` of the wait's start,
 * wait, unless the dependency refused and others' messages are applied meanwhile. Past it, the failure is the message's only when the dependency evidently works or is
 * there: the consumer applied messages (on any partition) since the wait began, or the
 * dependency answered and refused (`refused`: a key provider denying one tenant's key). With
 * neither, it is an outage: dead-lettering then would take it for the messages' failure.
 */
export function nextStep(
  w: DependencyWait,
  now: { at: number; applied: number },
  o: {
    boundMs: number;
    refused: boolean;
    /** It answered (a server that takes writes at the ping): past the bound, the message's. Refused implies it. */
    answered?: boolean;
  },
): WaitStep {
  if (w.tries === 0) {
    w.since = now.at;
    w.appliedBefore = now.applied;
  }
  const othersApplied = now.applied > w.appliedBefore;
  // Refused for this message while others are applied: the message's at once (its attempts,
  // each retried with backoff): a tenant's own key policy must not hold the partition, nor the
  // partitions fetched with it, for the whole bound, batch after batch.
  if (now.at - w.since <= o.boundMs) return o.refused && othersApplied ? 'message' : 'wait';
  return o.refused || o.answered || othersApplied ? 'message' : 'outage';
}

/** What dependencyWaiter takes: the consumer's retry options, its log, its stop, its applied count. */
export interface DependencyWaiterOptions {
  log: Logger;
  signal: AbortSignal;
  maxAttempts: number;
  retryBaseMs: number;
  retryMaxMs: number;
  /** Messages the consumer applied so far (all partitions): rises while the dependency works. */
  applied(): number;
}

/**
 * The inbox consumer's waits for a dependency other than Postgres. No attempt is counted
 * while one lasts; the chunk waits, with capped backoff and the batch's heartbeat going, and
 * runs again. Not forever: what Cairn cannot tell from an outage (a key provider that refuses
 * one tenant's key) would hold every message behind it. Past 4 x maxAttempts x retryMaxMs of a
 * batch's wait (100 s by default), the attempts count and the message is dead-lettered after
 * them (`cairn inbox replay` sends it again), when nextStep says it is the message's.
 */
export function dependencyWaiter(o: DependencyWaiterOptions) {
  /** The waits under way: waitingFor() says 'dependency' while there is one. */
  const waiting = new Set<DependencyWait>();
  const boundMs = 4 * o.maxAttempts * o.retryMaxMs;
  /**
   * What was refused and given up lately (a tenant's data key), and when: a later refusal of
   * the same thing, in any batch, is its message's at once. With kafkajs a waiting batch holds
   * the partitions fetched with it, so one tenant's disabled key cost every partition the whole
   * bound, batch after batch. Forgotten after REFUSAL_MEMORY_MS (a key enabled again is waited
   * for once more), at most REFUSALS_KEPT of them.
   */
  const refusedLately = new Map<string, number>();
  const subjectOf = (err: unknown) => (err instanceof UnavailableError ? err.subject : undefined);
  return {
    /** 'none': the failure is the message's; 'waited': try again; 'stopped': stop() ended the wait. */
    async back(
      err: unknown,
      w: DependencyWait,
      batch: { refused: boolean; answered?: boolean; beat(): void },
    ): Promise<'none' | 'waited' | 'stopped'> {
      const subject = batch.refused ? subjectOf(err) : undefined;
      const lately = subject !== undefined ? refusedLately.get(subject) : undefined;
      if (lately !== undefined && performance.now() - lately < REFUSAL_MEMORY_MS) {
        waiting.delete(w);
        return 'none';
      }
      // The dependency's own count of answers when it keeps one (a key provider's calls that
      // worked): messages applied meanwhile may never have called it, and a tenant can send
      // those at will (review finding: an outage of the key provider then dead-lettered every
      // message that needed a key).
      const evidence = (err instanceof UnavailableError && err.answers) || o.applied;
      if (w.evidence !== evidence) {
        w.evidence = evidence;
        w.appliedBefore = evidence();
      }
      const step = nextStep(
        w,
        { at: performance.now(), applied: evidence() },
        { boundMs, refused: batch.refused, answered: batch.answered ?? false },
      );
      if (step === 'message') {
        waiting.delete(w);
        return 'none';
      }
      const ms = Math.min(o.retryMaxMs * 2, o.retryBaseMs * 2 ** Math.min(w.tries++, 16));
      if (step === 'outage') {
        o.log.warn(
          { err: messageOf(err), waited_ms: Math.round(performance.now() - w.since), retry_in_ms: ms },
          'a dependency has not answered past the bound and nothing was applied since: an outage; waiting on, no attempt is counted',
        );
      } else {
        o.log.warn(
          { err: messageOf(err), retry_in_ms: ms },
          'a dependency is unavailable: waiting; no attempt is counted',
        );
      }
      waiting.add(w);
      try {
        const until = performance.now() + ms * (0.8 + Math.random() * 0.2);
        for (let left = until - performance.now(); left > 0; left = until - performance.now()) {
          batch.beat();
          await sleep(Math.min(left, 500), undefined, { signal: o.signal });
        }
        return 'waited';
      } catch {
        return 'stopped';
      }
    },
    /** The batch committed: its wait, if any, is over. */
    committed(w: DependencyWait): void {
      w.tries = 0;
      waiting.delete(w);
    },
    /**
     * A message given up (dead-lettered) past the bound: the next message of the batch is past
     * it too (not another full wait per message of a refused tenant), but only what is applied
     * from now on says the dependency works: an outage beginning later is not the next one's failure.
     */
    gaveUp(w: DependencyWait, err: unknown): void {
      w.appliedBefore = (w.evidence ?? o.applied)();
      if (!(err instanceof UnavailableError && err.refused)) return;
      const subject = subjectOf(err);
      if (subject === undefined) return;
      refusedLately.delete(subject);
      refusedLately.set(subject, performance.now());
      if (refusedLately.size > REFUSALS_KEPT) refusedLately.delete(refusedLately.keys().next().value!);
    },
    /** The batch ended (done, handed back, or stopped). */
    ended(w: DependencyWait): void {
      waiting.delete(w);
    },
    waiting: () => waiting.size > 0,
  };
}
