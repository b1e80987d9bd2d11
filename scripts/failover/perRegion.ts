/**
 * `--kafka per-region`: region B has its own broker, a MirrorMaker 2 mirror of region A's.
 *
 * Topic names: region A's relay and agents use the run's topics on A's broker. MirrorMaker
 * copies them to B as `A.<topic>` (same partitions, same order per partition). After the
 * failover region B's relay publishes what its outbox still holds, and every new message, to
 * the same (unprefixed) names on B's broker, and B's agents consume both the mirrored and the
 * local topic of their stage (DEMO_MIRROR_PREFIX). This needs no change to the relay or to the
 * outbox rows (they name the topics as region A wrote them). Order per key holds inside each
 * topic; across the two a task's messages are causal (one per stage, each sent by consuming the
 * one before), and a stale delivery would be refused by the task's version anyway.
 *
 * Group offsets on B come from MirrorMaker's checkpoints (sync.group.offsets) for the mirrored
 * topics; the local topics start from their beginning. The inbox drops what is re-delivered.
 */
import type { Kafka } from 'kafkajs';
import type { KafkaAdmin } from '../../src/kafka/admin.js';
import { createTopicsAndWait } from '../../src/kafka/kafkajsAdmin.js';
import type { FailoverReport } from '../../src/recovery/failover.js';
import { readTopicsToEnd } from '../../src/recovery/failover.js';
import type { Check } from '../demo/verify.js';
import { MIRROR_PREFIX, type RegionKafka, startRegionKafka, tailOf } from './regionKafka.js';
import type { WaitUntil } from './waitUntil.js';

export { MIRROR_PREFIX };

/** Starts region B's broker and the mirror; resolves once every topic is mirrored on B. */
export async function startRegionB(o: {
  root: string;
  run: string;
  topics: readonly string[];
  sourceBrokers: string;
  kafkaOf: (brokers: string) => Kafka;
  log: (line: string) => void;
}): Promise<RegionKafka> {
  const rk = await startRegionKafka({
    root: o.root,
    sourceBrokers: o.sourceBrokers,
    // The run's topics only (its name is [a-z0-9-]); dots matched literally.
    topicsRegex: `cairn[.]demo[.]${o.run}[.].*`,
    log: o.log,
  });
  try {
    const admin = o.kafkaOf(rk.brokers).admin();
    await admin.connect();
    try {
      // The local names, for region B's relay after the failover (3 partitions, as on A).
      await createTopicsAndWait(
        admin,
        o.topics.map((topic) => ({ topic, numPartitions: 3 })),
      );
      const until = Date.now() + 90_000;
      for (;;) {
        const have = new Set(await admin.listTopics());
        if (o.topics.every((t) => have.has(`${MIRROR_PREFIX}${t}`))) break;
        if (Date.now() > until) {
          throw new Error(
            `MirrorMaker did not mirror the run's topics within 90 s:\n${tailOf(rk.mirrorLog)}`,
          );
        }
        await new Promise((r) => setTimeout(r, 250));
      }
    } finally {
      await admin.disconnect();
    }
    return rk;
  } catch (err) {
    await rk.stop();
    throw err;
  }
}

/**
 * The truth about the mirror, from region A's broker (still reachable in the harness, never by
 * region B): the messages A's broker has that the mirror lacks, and the check that every
 * message the failover check reported as not mirrored really was published to A and is
 * missing from B.
 */
export async function mirrorTruth(
  kafkaA: KafkaAdmin,
  kafkaB: KafkaAdmin,
  topics: readonly string[],
  report: FailoverReport,
): Promise<{ unmirrored: number; checks: Check[] }> {
  const onA = await readTopicsToEnd(kafkaA, topics);
  const onB = new Set(
    (
      await readTopicsToEnd(
        kafkaB,
        topics.map((t) => `${MIRROR_PREFIX}${t}`),
      )
    ).map((m) => m.messageId),
  );
  const missing = new Set(onA.filter((m) => !onB.has(m.messageId)).map((m) => m.messageId));
  const wrong = report.unmirroredMessages.filter((u) => !missing.has(u.messageId)).length;
  return {
    unmirrored: missing.size,
    checks: [
      {
        name: 'reported unmirrored: on A, not on B (brokers)',
        expected: `${report.unmirroredMessages.length} of them`,
        actual: `${report.unmirroredMessages.length - wrong}`,
        violations: wrong,
      },
    ],
  };
}

/**
 * MirrorMaker lags: paused while region A goes on (two more task versions, or 20 s), so that A
 * publishes messages the mirror never gets; the kill that follows stops it for good, as the
 * loss of region A would.
 */
export async function lagMirror(
  regionB: RegionKafka,
  progress: () => Promise<number>,
  waitUntil: WaitUntil,
  log: (line: string) => void,
): Promise<void> {
  regionB.pauseMirror(true);
  const from = await progress();
  await waitUntil('region A to move on unmirrored', async () => (await progress()) >= from + 2, 20_000).catch(
    (err: Error) => {
      // Only the deadline is no finding (a check that failed is: waitUntil asked again for an outage).
      if (!/^failover: timed out /.test(err.message)) throw err;
      log('[failover] region A made no progress while the mirror was paused');
    },
  );
}
