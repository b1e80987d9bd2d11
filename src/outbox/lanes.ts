import { createHash } from 'node:crypto';

/**
 * Number of lanes the outbox is split into. Every message of a key lands in the same lane,
 * and a lane has one relay owner at a time: that is what keeps a key's order while several
 * relays share the work. Changing it reshuffles keys across lanes, so it is a constant.
 */
export const LANE_COUNT = 32;

/**
 * Lanes of keys seen lately: the hash cost the WAL relay about 1.5 µs of Node per message, and
 * a key comes back often (a task's messages share it). Short keys only, and a bounded count:
 * at most ~2.5 MB whatever the keys.
 */
const recent = new Map<string, number>();
const RECENT_MAX = 10_000;
const RECENT_KEY_MAX = 256;

/** First 4 bytes of sha256(key), modulo LANE_COUNT: stable across processes and versions. */
export function laneOf(key: string): number {
  const known = recent.get(key);
  if (known !== undefined) return known;
  const lane = createHash('sha256').update(key).digest().readUInt32BE(0) % LANE_COUNT;
  if (key.length <= RECENT_KEY_MAX) {
    if (recent.size >= RECENT_MAX) recent.clear();
    recent.set(key, lane);
  }
  return lane;
}
