/**
 * What the changelog (issue 20) costs the relay path, in one run: task transitions through the
 * TaskStore, each sending one 200-byte message, at a fixed rate while a relay publishes, with
 * the changelog off and then on (one more outbox row and Kafka record per transition). Reports
 * CPU µs per transition (Node, the database's backends, the broker: updates, relay and broker
 * together) and p50/p99 from the update's commit to the broker's ack of its message.
 */

import { createRelayWithTestHooks } from '../relay/relay.js';
import { createTopicsAndWait } from '../src/kafka/kafkajsAdmin.js';
import { createKafkaPublisher, kafkaClient } from '../src/kafka/publisher.js';
import { changelogTopicConfig } from '../src/state/changelog.js';
import { createTaskStore } from '../src/state/taskStore.js';
import { type CpuSpent, cpuDuring, cpuLine, cpuPerMsg, cpuSources } from './cpu.js';
import { outboxCount, PAYLOAD, percentile } from './outboxRows.js';
import { benchDatabase, flag } from './support.js';

export async function benchChangelog(args: string[]): Promise<Record<string, unknown>> {
  const quick = args.includes('--quick');
  const rate = flag(args, 'rate', 300);
  const seconds = flag(args, 'seconds', quick ? 5 : 15);
  const workers = flag(args, 'workers', 8);
  const env = await benchDatabase('changelog', workers + 6);
  const brokers = env.stack.kafkaBrokers.split(',');
  const admin = kafkaClient(brokers, 'bench-changelog').admin();
  await admin.connect();
  const stamp = Date.now();
  const stage = `bench.stage.${stamp}`;
  const changelogTopic = `bench.changelog.${stamp}`;
  await createTopicsAndWait(admin, [
    { topic: stage, numPartitions: 6 },
    changelogTopicConfig({ topic: changelogTopic }),
  ]);
  await admin.disconnect();
  const cpuSrc = await cpuSources(env);
  const actor = 'spiffe://bench.local/changelog';
  try {
    const run = async (mode: 'off' | 'on') => {
      const store = createTaskStore({
        db: env.db,
        ...(mode === 'on' ? { changelog: { topic: changelogTopic } } : {}),
      });
      const ids = Array.from({ length: workers }, (_, w) => `${mode}-${w}`);
      const versions = new Map<string, number>();
      for (const id of ids) {
        const t = await store.create({
          task: {
            tenant_id: 'bench',
            task_id: id,
            workflow_digest: `sha256:${'0'.repeat(64)}`,
            intent_id: 'bench',
            budget: { currency_committed_usd: 1, currency_spent_usd: 0, tokens_spent: 0, hops_used: 0 },
          },
          actor,
        });
        versions.set(id, t.version);
      }
      const committed = new Map<string, number>();
      const latencies: number[] = [];
      const relay = createRelayWithTestHooks(
        { db: env.db, publisher: createKafkaPublisher({ brokers }), leaseTtlMs: 10_000, maxIdleMs: 5 },
        {
          afterPublish: (_b, published) => {
            const now = performance.now();
            for (const id of published) {
              const c = committed.get(id);
              if (c !== undefined) latencies.push(now - c);
            }
          },
        },
      );
      const running = relay.run();
      await new Promise((r) => setTimeout(r, 800)); // lanes acquired
      let transitions = 0;
      const { cpu } = await cpuDuring(cpuSrc, async () => {
        const end = performance.now() + seconds * 1000;
        const perWorkerMs = (1000 * workers) / rate;
        await Promise.all(
          ids.map(async (id) => {
            let next = performance.now();
            let tokens = 0;
            while (performance.now() < end) {
              const r = await store.update({
                taskId: id,
                expectedVersion: versions.get(id)!,
                patch: { budget: { tokens_spent: ++tokens } },
                actor,
                messages: [{ topic: stage, payload: PAYLOAD }],
              });
              if (!r.ok) throw r.error;
              committed.set(r.messageIds[0]!, performance.now());
              versions.set(id, r.state.version);
              transitions++;
              next += perWorkerMs;
              const wait = next - performance.now();
              if (wait > 0) await new Promise((res) => setTimeout(res, wait));
            }
          }),
        );
        while ((await outboxCount(env.db)) > 0) await new Promise((r) => setTimeout(r, 20));
      });
      await relay.stop();
      await running;
      const sorted = latencies.sort((a, b) => a - b);
      return {
        mode,
        achieved: transitions / seconds,
        p50: percentile(sorted, 50),
        p99: percentile(sorted, 99),
        cpu: cpuPerMsg(cpu as CpuSpent, transitions),
      };
    };
    const off = await run('off');
    const on = await run('on');
    console.log(
      `transitions at ${rate}/s target, ${workers} tasks, ${seconds} s each, one 200 B message each`,
    );
    for (const r of [off, on]) {
      console.log(
        `changelog ${r.mode}: ${r.achieved.toFixed(0)} transitions/s, commit->ack p50 ${r.p50.toFixed(1)} ms, p99 ${r.p99.toFixed(1)} ms`,
      );
      console.log(`  ${cpuLine(r.cpu, 'transition')}`);
    }
    return {
      bench: 'changelog',
      rate,
      off: { achieved: Math.round(off.achieved), p50_ms: off.p50, p99_ms: off.p99 },
      on: { achieved: Math.round(on.achieved), p50_ms: on.p50, p99_ms: on.p99 },
      cpu_by_phase: { off: off.cpu, on: on.cpu },
    };
  } finally {
    await env.close();
  }
}
