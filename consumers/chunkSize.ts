/** The most messages one transaction applies when `chunkSize` is not set. */
export const MAX_CHUNK = 5000;
/** The first chunk's size, before the consumer has timed one. */
const FIRST_CHUNK = 500;
/** How long one chunk's transaction should take at most, judged from the previous one's pace. */
const CHUNK_BUDGET_MS = 1000;

/** How many messages the next transaction applies, and what the last one took. */
export interface ChunkSizer {
  next(): number;
  /** A chunk of `messages` committed after `ms` (the whole transaction, insert and handlers). */
  took(messages: number, ms: number): void;
}

/**
 * A set `chunkSize` is the size of every chunk. Without one, each transaction takes as many
 * messages as the previous one's pace says fit into about a second, up to MAX_CHUNK (growing at
 * most twofold from one chunk to the next): a fast handler then gets the whole Kafka batch in
 * one transaction, and a slow one still commits about once a second (heartbeats go inside a
 * chunk too: heartbeat.ts), as the fixed default of 500 did at 2 ms per message. Every
 * transaction costs a BEGIN, a COMMIT (a WAL flush) and an offset commit to the broker.
 * bench/inbox.ts's no-op handler, 200,000 messages, before/after alternating, 4 rounds, one
 * run: 433 -> 62 transactions, CPU per applied message 36.9 -> 27.5 µs (Node 16.1 -> 11.4,
 * Postgres 15.7 -> 14.7, broker 5.1 -> 1.5).
 */
export function chunkSizer(fixed: number | undefined): ChunkSizer {
  if (fixed !== undefined) return { next: () => fixed, took: () => {} };
  let size = FIRST_CHUNK;
  return {
    next: () => size,
    took(messages, ms) {
      const perMessage = ms / Math.max(1, messages);
      // Down at once, up at most twofold: one quick chunk (say, every message a duplicate) must
      // not make the next, maybe slow, one ten times as large.
      const fits = Math.floor(CHUNK_BUDGET_MS / Math.max(perMessage, 1e-3));
      size = Math.max(1, Math.min(MAX_CHUNK, size * 2, fits));
    },
  };
}
