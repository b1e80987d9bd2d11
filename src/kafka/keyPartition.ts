/**
 * The partition Kafka's Java client (and kafkajs's DefaultPartitioner) gives a key:
 * murmur2 of its bytes, made positive, modulo the partition count. Every adapter must place a
 * key where kafkajs does: a relay switched from one client to another would otherwise send a
 * key's next messages to another partition, and a consumer could apply them before the older
 * ones still waiting on the first. (@platformatic/kafka's own default partitioner skips the
 * sign mask, and its compatible one hashes with BigInt, which costs microseconds per message.)
 */
export function keyHash(key: Buffer): number {
  const m = 0x5bd1e995;
  const length = key.length;
  let h = 0x9747b28c ^ length;
  const whole = length & ~3;
  for (let i = 0; i < whole; i += 4) {
    let k = key[i]! | (key[i + 1]! << 8) | (key[i + 2]! << 16) | (key[i + 3]! << 24);
    k = Math.imul(k, m);
    k ^= k >>> 24;
    k = Math.imul(k, m);
    h = Math.imul(h, m) ^ k;
  }
  switch (length & 3) {
    // biome-ignore lint/suspicious/noFallthroughSwitchClause: murmur2 folds the tail bytes in turn
    case 3:
      h ^= key[whole + 2]! << 16;
    // biome-ignore lint/suspicious/noFallthroughSwitchClause: murmur2 folds the tail bytes in turn
    case 2:
      h ^= key[whole + 1]! << 8;
    case 1:
      h ^= key[whole]!;
      h = Math.imul(h, m);
  }
  h ^= h >>> 13;
  h = Math.imul(h, m);
  h ^= h >>> 15;
  return h & 0x7fffffff;
}

/** The partition of `key` among `partitions` partitions, as the Java client chooses it. */
export function keyPartition(key: Buffer, partitions: number): number {
  return keyHash(key) % partitions;
}
