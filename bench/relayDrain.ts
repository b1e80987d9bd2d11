import { createRelay, type RelayOptions } from '../relay/relay.js';
import type { Db } from '../src/db/database.js';
import type { KafkaClientName } from '../src/kafka/clientChoice.js';
import { createKafkaPublisher, type Publisher } from '../src/kafka/publisher.js';
import { type CpuSources, type CpuSpent, cpuDuring } from './cpu.js';
import { insertRows, outboxCount, rows } from './outboxRows.js';

export interface DrainRun {
  seconds: number;
  cpu: CpuSpent;
  /** The share of the drain Node's event loop was busy (1: the relay's one thread was the bound). */
  loopBusy: number;
  /** Messages per second from the relay's first acknowledged batch to its last (its start-up left out). */
  afterFirstAck: number;
  /** How many batches the relay published (the client's cost per message falls as they grow). */
  batches: number;
  /** How many the first ack covered, and when it came (seconds after the relay was started). */
  firstCount: number;
  firstAckS: number;
}

/**
 * A backlog of `n` messages of 200 B committed while no relay runs (the slot, in the WAL
 * modes, kept what follows its position), then drained by a relay started on it: the whole
 * run timed, and again from the first ack to the last.
 */
export async function drainBacklog(o: {
  db: Db;
  topic: string;
  n: number;
  walMessages: boolean;
  relay: Partial<RelayOptions>;
  brokers: string[];
  client: KafkaClientName;
  cpu: CpuSources;
  /** Run after the drain, the relay still running (the WAL modes move the slot's restart point past it). */
  beforeStop?: () => Promise<unknown>;
  /** Instead of the client's Publisher (the relay's own work measured alone: instantPublisher). */
  publisher?: Publisher;
}): Promise<DrainRun> {
  for (let i = 0; i < Math.ceil(o.n / 1000); i++)
    await insertRows(o.db, rows(1000, 1000, o.topic), o.walMessages);
  // The acks are counted as they come, through the Publisher (no poll of the relay's stats on
  // the relay's own thread, which a Publisher run alone does not pay): the first and the last.
  const inner = o.publisher ?? createKafkaPublisher({ brokers: o.brokers, client: o.client });
  const acks = { start: 0, first: 0, firstCount: 0, last: 0, count: 0, batches: 0 };
  let allAcked!: () => void;
  const drained = new Promise<void>((resolve) => {
    allAcked = resolve;
  });
  const counting: Publisher = {
    address: inner.address,
    connect: () => inner.connect(),
    disconnect: () => inner.disconnect(),
    async publish(messages) {
      await inner.publish(messages);
      acks.count += messages.length;
      acks.batches++;
      acks.last = performance.now();
      if (acks.first === 0) Object.assign(acks, { first: acks.last, firstCount: acks.count });
      if (acks.count >= o.n) allAcked();
    },
  };
  // Connected before the clock starts, as the Publisher run's is (bench/rawPublisher.ts): the
  // relay's own connect() finds it connected.
  await inner.connect();
  const drainer = createRelay({ ...o.relay, db: o.db, publisher: counting });
  let running: Promise<void> | undefined;
  // The relay's start-up (connecting to Postgres, opening the stream, taking the lanes) is before the first ack.
  const drain = await cpuDuring(o.cpu, async () => {
    acks.start = performance.now();
    running = drainer.run();
    await Promise.race([drained, running]);
    if (acks.count < o.n) throw new Error(`the relay stopped after ${acks.count} of ${o.n} messages`);
    while ((await outboxCount(o.db)) > 0) await new Promise((r) => setTimeout(r, 20));
  });
  await o.beforeStop?.();
  await drainer.stop();
  await running;
  return {
    seconds: drain.seconds,
    cpu: drain.cpu,
    loopBusy: drain.loopBusy,
    afterFirstAck: (o.n - acks.firstCount) / ((acks.last - acks.first) / 1000),
    firstCount: acks.firstCount,
    batches: acks.batches,
    firstAckS: (acks.first - acks.start) / 1000,
  };
}

/**
 * A Publisher that acknowledges every batch at once and sends nothing: a drain through it is the
 * relay's own work (reading, decoding, building messages, confirming), without the client's.
 */
export const instantPublisher: Publisher = {
  address: 'nowhere (the bench: acknowledged at once)',
  connect: async () => {},
  publish: async () => {},
  disconnect: async () => {},
};
