import type { ThreadScope } from './integrity.js';

/** How many checkpoint digests a saver keeps. */
const DIGESTS_KEPT = 10_000;

/**
 * Digests of checkpoints a saver wrote or read, so a put rarely has to ask for its parent's
 * (cairn_lg_put checks the one given under the thread's lock). Bounded: the least recently
 * remembered are forgotten first.
 */
export class DigestCache {
  private readonly digests = new Map<string, string>();

  get(s: ThreadScope, id: string): string | undefined {
    return this.digests.get(keyOf(s, id));
  }

  remember(s: ThreadScope, id: string, digest: string): void {
    const key = keyOf(s, id);
    this.digests.delete(key);
    this.digests.set(key, digest);
    if (this.digests.size > DIGESTS_KEPT) this.digests.delete(this.digests.keys().next().value!);
  }
}

const keyOf = (s: ThreadScope, id: string) => `${s.ns}\n${s.thread}\n${id}`;
