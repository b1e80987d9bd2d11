import { createHash } from 'node:crypto';

/**
 * Number of lanes the outbox is split into. Every message of a key lands in the same lane,
 * and a lane has one relay owner at a time: that is what keeps a key's order while several
 * relays share the work. Changing it reshuffles keys across lanes, so it is a constant.
 */
export const LANE_COUNT = 32;

/** First 4 bytes of sha256(key), modulo LANE_COUNT: stable across processes and versions. */
export function laneOf(key: string): number {
  return createHash('sha256').update(key).digest().readUInt32BE(0) % LANE_COUNT;
}
