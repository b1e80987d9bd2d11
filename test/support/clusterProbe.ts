import type { PartitionMetadata } from 'kafkajs';
import type { ClusterNode } from '../../cli/stack/cluster.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
import { waitFor } from './topicReader.js';

/**
 * Waits until every node of the cluster, asked on its own, answers `topic`'s metadata so that
 * `agrees(partitions)` holds: each broker learns of a new topic or leader from the controller on
 * its own time, and a client that asks the wrong one meanwhile is told something else.
 */
export async function everyNodeAgrees(
  nodes: readonly ClusterNode[],
  topic: string,
  what: string,
  agrees: (partitions: readonly PartitionMetadata[]) => boolean,
  deadlineMs = 60_000,
): Promise<void> {
  await waitFor(
    what,
    async () => {
      for (const n of nodes) {
        const one = kafkaClient([n.address], 'cluster-probe').admin();
        try {
          await one.connect();
          const meta = await one.fetchTopicMetadata({ topics: [topic] });
          if (!agrees(meta.topics[0]?.partitions ?? [])) return false;
        } catch {
          return false;
        } finally {
          await one.disconnect().catch(() => {});
        }
      }
      return true;
    },
    deadlineMs,
  );
}
