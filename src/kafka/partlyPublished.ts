import { CairnError, CairnErrorCodes } from '../errors.js';
import type { PartitionRecord } from './acknowledgements.js';
import { isPoisonError } from './classifyError.js';
import type { PublishMessage } from './publisher.js';

/**
 * The broker refused some messages of a send for good and wrote others: `acknowledged` holds the
 * message objects (as given to publish()) it has, so they are not sent again. The refusal is the
 * `cause` (isPoisonError holds for this error).
 */
export class PartlyPublishedError extends CairnError {
  readonly acknowledged: ReadonlySet<PublishMessage>;

  constructor(acknowledged: ReadonlySet<PublishMessage>, refusal: unknown) {
    super(
      CairnErrorCodes.PublishFailed,
      `the broker refused part of a send (${(refusal as Error)?.message ?? String(refusal)}) ` +
        `and acknowledged ${acknowledged.size} of its messages`,
      { cause: refusal },
    );
    this.acknowledged = acknowledged;
  }
}

type TopicMessages = Array<{ topic: string; messages: PublishMessage[] }>;

/**
 * After a refused send: sends each partition's messages again, alone and as they were, and says
 * which the broker has.
 *
 * kafkajs sends every partition a broker leads in one produce request. When one partition
 * refuses (MESSAGE_TOO_LARGE), the broker still writes the others, but kafkajs throws the
 * first error only and rolls back the idempotent sequence numbers of every partition of the
 * request. A partition sent again with the same producer and exactly the same messages has
 * exactly the same sequence range, which the broker recognizes as a duplicate of what it wrote:
 * it acknowledges without writing. Any other send there (one message alone, say) is out of
 * order, and a fresh producer would write the partition a second time. So this runs right
 * after the refusal, on the same producer, before anything else is sent.
 *
 * Returns a PartlyPublishedError when some partition was acknowledged, else the refusal; a
 * failure that is no refusal (the broker went away) is thrown as it is.
 */
export async function sortRefusal(
  refusal: unknown,
  sent: TopicMessages,
  partitionOf: PartitionRecord,
  send: (topicMessages: TopicMessages) => Promise<void>,
): Promise<unknown> {
  const groups: TopicMessages = [];
  for (const { topic, messages } of sent) {
    const byPartition = new Map<number, PublishMessage[]>();
    for (const m of messages) {
      const p = partitionOf.get(m) ?? -1;
      const list = byPartition.get(p);
      if (list) list.push(m);
      else byPartition.set(p, [m]);
    }
    for (const list of byPartition.values()) groups.push({ topic, messages: list });
  }
  if (groups.length <= 1) return refusal;
  const acknowledged = new Set<PublishMessage>();
  for (const group of groups) {
    try {
      await send([group]);
      for (const m of group.messages) acknowledged.add(m);
    } catch (err) {
      if (!isPoisonError(err)) throw err;
    }
  }
  return acknowledged.size > 0 ? new PartlyPublishedError(acknowledged, refusal) : refusal;
}
