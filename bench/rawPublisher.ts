import type { KafkaClientName } from '../src/kafka/clientChoice.js';
import { createKafkaPublisher } from '../src/kafka/publisher.js';
import { type CpuPerMsg, type CpuSources, cpuDuring, cpuPerMsg } from './cpu.js';
import { PAYLOAD, rows } from './outboxRows.js';

export interface RawPublisherRun {
  msgs_per_s: number;
  cpu: CpuPerMsg;
  /** Each run's msgs/s, in order: the figure above is their median. */
  runs: number[];
}

/**
 * A client's own Publisher with no Postgres: `n` messages of 200 B with the header the relay
 * puts on them (cairn-message-id), in batches of `batch` one after another, what a drain is
 * compared with. Three runs, the median reported: one run of a few seconds on a shared
 * machine varied by a third between two benches (55,518 and 76,250 msgs/s), which moved the
 * drain's ratio as much.
 */
export async function rawPublisher(o: {
  brokers: string[];
  client: KafkaClientName;
  topic: string;
  n: number;
  batch: number;
  cpu: CpuSources;
  runs?: number;
}): Promise<RawPublisherRun> {
  const pub = createKafkaPublisher({ brokers: o.brokers, client: o.client });
  await pub.connect();
  try {
    const results: Array<{ perS: number; cpu: CpuPerMsg }> = [];
    for (let r = 0; r < (o.runs ?? 3); r++) {
      const msgs = rows(o.n, 1000, o.topic).map((m) => ({
        topic: o.topic,
        key: m.key,
        value: PAYLOAD,
        headers: { 'cairn-message-id': m.id },
      }));
      const spent = await cpuDuring(o.cpu, async () => {
        for (let i = 0; i < msgs.length; i += o.batch) await pub.publish(msgs.slice(i, i + o.batch));
      });
      results.push({ perS: o.n / spent.seconds, cpu: cpuPerMsg(spent.cpu, o.n) });
    }
    const median = [...results].sort((a, b) => a.perS - b.perS)[Math.floor(results.length / 2)]!;
    return {
      msgs_per_s: Math.round(median.perS),
      cpu: median.cpu,
      runs: results.map((r) => Math.round(r.perS)),
    };
  } finally {
    await pub.disconnect();
  }
}
