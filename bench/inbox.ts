/**
 * Messages applied exactly once per second by the inbox consumer (dedupe row in the same
 * transaction as the handler, offset committed after it) against a raw kafkajs consumer that
 * does nothing, on the same topic in the same run. Target: >= 20,000 applied/s. Both also
 * report CPU µs per message of Node, the database's backends and the broker, from the
 * consumer's start (group join included) to its last message. `--clients kafkajs,platformatic,confluent`
 * runs the inbox on each client in turn, in one run, against the same raw consumer.
 */
import { randomUUID } from 'node:crypto';
import { Partitioners } from 'kafkajs';
import { sql } from 'kysely';
import { v7 as uuidv7 } from 'uuid';
import { createInboxConsumer } from '../consumers/inboxConsumer.js';
import type { KafkaClientName } from '../src/kafka/clientChoice.js';
import { createTopicsAndWait } from '../src/kafka/kafkajsAdmin.js';
import { createKafkaPublisher, kafkaClient } from '../src/kafka/publisher.js';
import { createKafkaSubscriber } from '../src/kafka/subscriber.js';
import { type CpuPerMsg, cpuDuring, cpuLine, cpuPerMsg, cpuSources } from './cpu.js';
import { benchDatabase, clientsFlag, flag } from './support.js';

export async function benchInbox(args: string[]): Promise<Record<string, unknown>> {
  const quick = args.includes('--quick');
  const n = flag(args, 'messages', quick ? 30_000 : 200_000);
  // Without --chunk the consumer sizes its chunks itself (its default); --chunk N fixes them.
  const chunk = args.includes('--chunk') ? flag(args, 'chunk', 500) : undefined;
  const clients = clientsFlag(args);
  const env = await benchDatabase('inbox', 8);
  const brokers = env.stack.kafkaBrokers.split(',');
  const kafka = kafkaClient(brokers, 'bench-inbox');
  const topic = `bench.inbox.${Date.now()}`;
  const admin = kafka.admin();
  await admin.connect();
  await createTopicsAndWait(admin, [{ topic, numPartitions: 6 }]);
  const cpuSrc = await cpuSources(env);
  try {
    const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
    await producer.connect();
    const value = Buffer.alloc(200, 'x');
    for (let i = 0; i < n; i += 2000) {
      await producer.send({
        topic,
        acks: -1,
        messages: Array.from({ length: Math.min(2000, n - i) }, (_, j) => ({
          key: `key-${(i + j) % 1000}`,
          value,
          headers: { 'cairn-message-id': uuidv7() },
        })),
      });
    }
    await producer.disconnect();

    // Raw: a kafkajs consumer that does nothing but count.
    const raw = kafka.consumer({ groupId: `bench-raw-${randomUUID()}`, maxWaitTimeInMs: 100 });
    await raw.connect();
    await raw.subscribe({ topic, fromBeginning: true });
    let rawCount = 0;
    let t0 = 0;
    const rawCpu = await cpuDuring(cpuSrc, async () => {
      await new Promise<void>((resolve) => {
        void raw.run({
          eachBatch: async ({ batch }) => {
            if (t0 === 0) t0 = performance.now();
            rawCount += batch.messages.length;
            if (rawCount >= n) resolve();
          },
        });
      });
    });
    const rawPerS = n / ((performance.now() - t0) / 1000);
    await raw.disconnect();

    // Inbox: exactly once, the handler does nothing (this measures what exactly-once costs);
    // each client in turn reads the whole topic with a group of its own. The inbox tables are
    // emptied between clients (outside the measured section) so each starts from the same state.
    const runs: Array<{
      client: KafkaClientName;
      perS: number;
      cpu: CpuPerMsg;
      duplicates: number;
      commits: number;
    }> = [];
    for (const client of clients) {
      await sql`TRUNCATE inbox, inbox_key_version`.execute(env.db);
      const groupId = `bench-inbox-${randomUUID()}`;
      const consumer = createInboxConsumer({
        db: env.db,
        groupId,
        subscriber: createKafkaSubscriber({ brokers, groupId, topics: [topic], client }),
        dlqPublisher: createKafkaPublisher({ brokers, client }),
        ...(chunk === undefined ? {} : { chunkSize: chunk }),
        handler: async () => {},
      });
      let t1 = 0;
      let started = 0;
      const inboxCpu = await cpuDuring(cpuSrc, async () => {
        started = performance.now();
        void consumer.run();
        while (consumer.stats().applied < n) {
          if (t1 === 0 && consumer.stats().applied > 0) t1 = performance.now();
          await new Promise((r) => setTimeout(r, 5));
        }
      });
      const s = consumer.stats();
      runs.push({
        client,
        perS: n / ((performance.now() - (t1 || started)) / 1000),
        cpu: cpuPerMsg(inboxCpu.cpu, n),
        duplicates: s.duplicates,
        commits: s.commits,
      });
      await consumer.stop();
    }

    const rawCpuPerMsg = cpuPerMsg(rawCpu.cpu, n);
    console.log(
      `messages: ${n} x 200 B on 6 partitions, inbox chunk ${chunk ?? 'default (up to 5,000, by pace)'}, inbox on ${clients.join(', ')} (in this order)`,
    );
    console.log(`raw kafkajs consumer (no-op)      ${rawPerS.toFixed(0).padStart(8)} msgs/s`);
    console.log(`  ${cpuLine(rawCpuPerMsg)}`);
    const byClient: Record<string, Record<string, unknown>> = {};
    for (const r of runs) {
      const ratio = r.perS / rawPerS;
      console.log(`[${r.client}]`);
      console.log(
        `inbox consumer, exactly once      ${r.perS.toFixed(0).padStart(8)} applied/s  (target >= 20,000)`,
      );
      console.log(`  ${cpuLine(r.cpu)}`);
      console.log(`ratio                             ${ratio.toFixed(2).padStart(8)}`);
      console.log(`duplicates ${r.duplicates}, transactions ${r.commits}`);
      byClient[r.client] = {
        applied_per_s: Math.round(r.perS),
        ratio: Number(ratio.toFixed(3)),
        transactions: r.commits,
        cpu_by_phase: { inbox: r.cpu },
      };
    }
    console.log(`CPU: ${cpuSrc.brokerSource}; ${cpuSrc.postgresSource}`);
    const first = runs[0]!;
    return {
      bench: 'inbox',
      kafka_client: first.client,
      kafka_clients: clients,
      applied_per_s: Math.round(first.perS),
      raw_consume_per_s: Math.round(rawPerS),
      ratio: Number((first.perS / rawPerS).toFixed(3)),
      cpu_broker: cpuSrc.brokerSource,
      cpu_postgres: cpuSrc.postgresSource,
      cpu_by_phase: { inbox: first.cpu, raw_consumer: rawCpuPerMsg },
      by_client: byClient,
    };
  } finally {
    await admin.deleteTopics({ topics: [topic] }).catch(() => {});
    await admin.disconnect();
    await env.close();
  }
}
