import type { KafkaClientName } from '../src/kafka/clientChoice.js';
import { createKafkaPublisher } from '../src/kafka/publisher.js';
import { type CpuPerMsg, type CpuSources, cpuDuring, cpuPerMsg } from './cpu.js';
import { PAYLOAD, rows } from './outboxRows.js';

export interface RawPublisherRun {
  msgs_per_s: number;
  /**
   * The same run from its first batch's ack to its last (the messages after the first batch):
   * what a relay's drain after its own first ack is compared with (the start-up in neither).
   */
  after_first_ack_msgs_per_s: number;
  cpu: CpuPerMsg;
  /** The share of the run Node's event loop was busy (1: its one thread was the bound). */
  loop_busy: number;
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
    const results: Array<{ perS: number; afterFirstAck: number; cpu: CpuPerMsg; loopBusy: number }> = [];
    for (let r = 0; r < (o.runs ?? 3); r++) {
      const msgs = rows(o.n, 1000, o.topic).map((m) => ({
        topic: o.topic,
        key: m.key,
        value: PAYLOAD,
        headers: { 'cairn-message-id': m.id },
      }));
      let firstAck = 0;
      let lastAck = 0;
      const spent = await cpuDuring(o.cpu, async () => {
        for (let i = 0; i < msgs.length; i += o.batch) {
          await pub.publish(msgs.slice(i, i + o.batch));
          lastAck = performance.now();
          if (i === 0) firstAck = lastAck;
        }
      });
      const afterFirstS = (lastAck - firstAck) / 1000;
      results.push({
        perS: o.n / spent.seconds,
        afterFirstAck: (o.n - Math.min(o.batch, o.n)) / afterFirstS,
        cpu: cpuPerMsg(spent.cpu, o.n),
        loopBusy: spent.loopBusy,
      });
    }
    const median = [...results].sort((a, b) => a.perS - b.perS)[Math.floor(results.length / 2)]!;
    return {
      msgs_per_s: Math.round(median.perS),
      after_first_ack_msgs_per_s: Math.round(median.afterFirstAck),
      cpu: median.cpu,
      loop_busy: Number(median.loopBusy.toFixed(2)),
      runs: results.map((r) => Math.round(r.perS)),
    };
  } finally {
    await pub.disconnect();
  }
}
