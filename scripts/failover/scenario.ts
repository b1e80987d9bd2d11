import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { createCheckpointer } from '../../src/checkpoints/checkpoints.js';
import { createDb, type Db } from '../../src/db/database.js';
import { migrateToLatest } from '../../src/db/migrate.js';
import { createKafkaAdmin, type KafkaAdmin } from '../../src/kafka/admin.js';
import { createTopicsAndWait } from '../../src/kafka/kafkajsAdmin.js';
import { kafkaClient } from '../../src/kafka/publisher.js';
import { checkAfterFailover, quarantine } from '../../src/recovery/failover.js';
import { createTaskStore } from '../../src/state/taskStore.js';
import { isTerminal } from '../../src/state/transitions.js';
import { createDemoTask } from '../demo/tasks.js';
import { verifyDemo } from '../demo/verify.js';
import { ROLES, type Role, topicOf } from '../demo/workflow.js';
import { type Sink, startSink } from '../lib/effectSink.js';
import { type Child, sigkill, sigterm, spawnTs } from '../lib/spawnTs.js';
import { cutOffRegionA } from './asyncLoss.js';
import { installChangelogGap, replayIntoRegionB, runKeyRing } from './changelogReplay.js';
import { regionATruth, snapshot, startWitness } from './evidence.js';
import { lagMirror, MIRROR_PREFIX, mirrorTruth, startRegionB } from './perRegion.js';
import { type PgServer, requireSynchronous, startPrimary, startStandby } from './pgCluster.js';
import type { RegionKafka } from './regionKafka.js';
import type { FailoverOptions, FailoverResult } from './scenarioTypes.js';
import { effectChecks, resumeOpenTasks } from './takeover.js';
import { waitUntil } from './waitUntil.js';

export type { FailoverOptions, FailoverResult };

const ROLE_NAMES = Object.keys(ROLES) as Role[];
const demoProgress = async (db: Db) =>
  (
    await sql<{
      n: number;
    }>`SELECT coalesce(sum(version), 0)::int AS n FROM task_state WHERE task_id LIKE 'demo-%'`.execute(db)
  ).rows[0]!.n;

/**
 * Region A (a primary, a relay, four agents) runs the demo workflow while a witness writer
 * records every transition region A acknowledges; region B is a streaming standby. Region A
 * is killed (SIGKILL, immediate stop), B is promoted, checked against the broker and the
 * effect sink, started, and every task is resumed from its checkpoint. In `async` mode the
 * standby is cut off first, so that region A commits work region B never receives.
 */
export async function runFailover(o: FailoverOptions): Promise<FailoverResult> {
  const root = mkdtempSync(join(tmpdir(), 'cairn-failover-'));
  const procs: Child[] = [];
  const servers: PgServer[] = [];
  const dbs: Db[] = [];
  let sink: Sink | undefined;
  let regionB: RegionKafka | undefined;
  const perRegion = o.kafka === 'per-region';
  let readerA: KafkaAdmin | undefined;
  let readerB: KafkaAdmin | undefined;
  try {
    // --- regions ------------------------------------------------------------------------
    const a = await startPrimary(root, 'region_a');
    servers.push(a);
    await a.query('CREATE DATABASE cairn');
    const dbA = createDb({ connectionString: a.url('cairn'), max: 4, applicationName: 'failover-region-a' });
    dbs.push(dbA);
    await migrateToLatest(dbA);
    await sql`CREATE TABLE demo_event (kind text NOT NULL, n int NOT NULL, at timestamptz NOT NULL DEFAULT now())`.execute(
      dbA,
    );
    const b = await startStandby(root, 'region_b', a);
    servers.push(b);
    if (o.mode === 'sync') await requireSynchronous(a, 'region_b');
    await waitUntil(
      `region_b to stream${o.mode === 'sync' ? ' synchronously' : ''}`,
      async () =>
        (
          await a.query<{ state: string; sync_state: string }>(
            "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = 'region_b'",
          )
        ).some((r) => r.state === 'streaming' && (o.mode === 'async' || r.sync_state === 'sync')),
      30_000,
    );
    o.log(`[failover] region A primary :${a.port}, region B standby :${b.port} (${o.mode} replication)`);

    // --- topics, sink, region A's processes -----------------------------------------------
    // Random too: the two failover tests may start in the same millisecond (they run side by side).
    const run = `failover-${o.mode}-${Date.now().toString(36)}-${randomBytes(3).toString('hex')}`;
    const stageTopics = ['planning', 'implementing', 'reviewing', 'testing'].map((s) => topicOf(run, s));
    const witnessTopic = topicOf(run, 'witness');
    // Every committed version also goes to the changelog (issue 20), signed with the run's ring.
    const changelogTopic = topicOf(run, 'changelog');
    const signing = runKeyRing(run);
    const kafka = kafkaClient(o.kafkaBrokers.split(','), 'cairn-failover');
    const admin = kafka.admin();
    await admin.connect();
    await createTopicsAndWait(
      admin,
      [...stageTopics, witnessTopic, changelogTopic].map((topic) => ({ topic, numPartitions: 3 })),
    );
    await admin.disconnect();
    // The changelog too: mirrored, and read by the check. A checkpoint's pending work names the
    // changelog record of its version (an outbox row of the task like any other), so a check
    // that did not read the topic would take every published record for one never mirrored and
    // hold the task; read, a record newer than region B's version after the replay is a lost
    // transition, of a task the replay could not rebuild (held either way).
    const allTopics = [...stageTopics, witnessTopic, changelogTopic];
    if (perRegion) {
      regionB = await startRegionB({
        root,
        run,
        topics: allTopics,
        sourceBrokers: o.kafkaBrokers,
        kafkaOf: (b) => kafkaClient(b.split(','), 'cairn-failover'),
        log: o.log,
      });
    }
    // What the replay, the check and the mirror comparison read with (CAIRN_KAFKA_CLIENT's client).
    readerA = createKafkaAdmin({ brokers: o.kafkaBrokers.split(','), clientId: 'cairn-failover' });
    const kafkaB = regionB
      ? createKafkaAdmin({ brokers: [regionB.brokers], clientId: 'cairn-failover-b' })
      : readerA;
    readerB = kafkaB;
    sink = await startSink();
    const regionEnv = (url: string, region: string) => ({
      DATABASE_URL: url,
      KAFKA_BROKERS: region === 'b' && regionB ? regionB.brokers : o.kafkaBrokers,
      ...(region === 'b' && regionB ? { DEMO_MIRROR_PREFIX: MIRROR_PREFIX } : {}),
      DEMO_RUN: run,
      SINK_URL: sink!.url,
      CAIRN_RELAY_LEASE_TTL_MS: '2000',
      CAIRN_RELAY_MAX_IDLE_MS: '50',
      DEMO_WORK_MS: String(o.workMs),
      CAIRN_RELAY_INSTANCE: `relay-${region}`,
      DEMO_CHANGELOG_TOPIC: changelogTopic,
      CAIRN_CHECKPOINT_KEYS: signing.env,
    });
    const startRegion = (url: string, region: string) => {
      const started = [
        spawnTs(`${region}-relay`, 'relay/main.ts', regionEnv(url, region)),
        ...ROLE_NAMES.map((r) =>
          spawnTs(`${region}-${r}`, 'scripts/demo/agent.ts', { ...regionEnv(url, region), DEMO_ROLE: r }),
        ),
      ];
      procs.push(...started);
      return started;
    };
    const gap =
      o.changelogGap && o.mode === 'async' ? await installChangelogGap(dbA, changelogTopic) : undefined;
    const regionA = startRegion(a.url('cairn'), 'a');

    const storeA = createTaskStore({
      db: dbA,
      checkpointer: createCheckpointer({ db: dbA, keyRing: signing.ring }),
      changelog: { topic: changelogTopic, keyRing: signing.ring },
    });
    for (let i = 0; i < o.tasks; i++) await createDemoTask(dbA, storeA, run, i);
    const witness = startWitness(storeA, witnessTopic);
    await witness.ready;

    // --- let region A get half-way ----------------------------------------------------------
    const target = Math.floor(o.tasks * 2.5);
    await waitUntil(
      `region A half-way (${target} of ${o.tasks * 5} versions)`,
      async () => (await demoProgress(dbA)) >= target,
      o.timeoutS * 1000,
    );
    if (o.mode === 'async') {
      await cutOffRegionA({
        a,
        b,
        dbA,
        agents: new Map(ROLE_NAMES.map((r, n) => [r, regionA[n + 1]!])),
        witnessWrites: witness.count,
        demoProgress: () => demoProgress(dbA),
        waitUntil,
        timeoutMs: o.timeoutS * 1000,
        log: o.log,
        ...(gap ? { afterCut: gap.arm } : {}),
      });
    }

    if (regionB) await lagMirror(regionB, () => demoProgress(dbA), waitUntil, o.log);

    // --- region A dies ----------------------------------------------------------------------
    const killedAt = Date.now();
    regionB?.killMirror();
    await Promise.all([...regionA.map((c) => sigkill(c)), witness.stop(), a.crash()]);
    o.log(`[failover] region A killed (${regionA.length} processes SIGKILLed, primary stopped immediately)`);
    await b.promote();
    const promotedAt = Date.now();
    const dbB = createDb({ connectionString: b.url('cairn'), max: 6, applicationName: 'failover-region-b' });
    dbs.push(dbB);
    const atPromotion = await snapshot(
      async (text) => (await sql.raw(text).execute(dbB)).rows as Array<Record<string, unknown>>,
    );

    // --- rebuild what the changelog proves, then: what did region B not receive? ----------------
    // On its own cluster region B sees the mirror: the topics as MirrorMaker names them.
    const seenAs = (t: string) => (regionB ? `${MIRROR_PREFIX}${t}` : t);
    const replay = await replayIntoRegionB(dbB, kafkaB, {
      topic: seenAs(changelogTopic),
      keyRing: signing.ring,
      ...(regionB ? { sourcePrefix: MIRROR_PREFIX } : {}),
      log: o.log,
    });
    const groups = ROLE_NAMES.map((r) => ({
      groupId: `demo-${run}-${r}`,
      topics: [seenAs(topicOf(run, ROLES[r].from))],
    }));
    const report = await checkAfterFailover(dbB, kafkaB, {
      topics: allTopics.map(seenAs),
      consumers: groups,
      ...(regionB ? { sourcePrefix: MIRROR_PREFIX } : {}),
      appliedEffects: [...sink.keysByOperation].flatMap(([taskId, keys]) =>
        [...keys].filter((k) => sink!.applied.has(k)).map((idempotencyKey) => ({ idempotencyKey, taskId })),
      ),
    });
    const checkedAt = Date.now();
    await o.afterCheck?.(b.url('cairn'), allTopics.map(seenAs), groups, regionB?.brokers ?? o.kafkaBrokers);
    // Held: what the check still finds diverged after the replay, and what the replay could not prove.
    const diverged = new Set([...report.divergedTasks, ...replay.report.incomplete.map((i) => i.taskId)]);
    await quarantine(dbB, report.divergedTasks, {
      reason: 'failover: region B lacks work the outside world saw',
      actor: 'spiffe://demo.cairn.local/failover/operator',
    });
    for (const i of replay.report.incomplete) {
      await quarantine(dbB, [i.taskId], {
        reason: `failover: the changelog cannot rebuild what region B lost: ${i.reason}`,
        actor: 'spiffe://demo.cairn.local/failover/operator',
      });
    }
    const witnessLost = [...witness.acked].reduce(
      (n, [id, v]) => n + Math.max(0, v - (atPromotion.versions.get(id) ?? 0)),
      0,
    );
    // The witness again after the replay: what the changelog could not give back.
    const afterReplay = new Map(
      (
        await dbB
          .selectFrom('task_state')
          .select(['task_id', 'version'])
          .where('task_id', 'like', 'witness-%')
          .execute()
      ).map((r) => [r.task_id, r.version] as const),
    );
    const witnessStillLost = [...witness.acked].reduce(
      (n, [id, v]) => n + Math.max(0, v - (afterReplay.get(id) ?? 0)),
      0,
    );
    o.log(
      `[failover] check: ${report.lostTransitions.length} lost transitions, ${report.lostConsumptions.length} lost consumptions, ` +
        `${report.missingReceipts.length} missing receipts, ${report.unmirroredMessages.length} messages not mirrored, ${diverged.size} tasks held ` +
        `(${report.divergedTasks.length} diverged, ${replay.report.incomplete.length} incomplete in the changelog); witness writes lost ${witnessLost} of ${witness.count()}, ${witnessStillLost} after the replay`,
    );

    // --- region B takes over: its processes, then every task resumed from its checkpoint ----
    startRegion(b.url('cairn'), 'b');
    const resumed = await resumeOpenTasks(dbB, signing.ring, diverged);
    const resumedAt = Date.now();

    let rtoMs: number | null = null;
    // A lagging mirror can leave every open task held: then nothing resumes and there is no
    // first transition to time (RTO not measured), only the holds to check.
    const open = await dbB
      .selectFrom('task_state')
      .select(['task_id', 'status'])
      .where('task_id', 'like', 'demo-%')
      .execute();
    const resumable = open.filter((t) => !isTerminal(t.status as never) && !diverged.has(t.task_id)).length;
    if (resumable > 0)
      await waitUntil(
        'the first transition in region B',
        async () => {
          // A replayed audit row keeps its transition's actor (an agent's): it is not region B's work.
          const r = await sql<{ at: Date }>`
          SELECT min(at) AS at FROM task_audit
           WHERE actor LIKE '%/agents/%' AND at > to_timestamp(${promotedAt / 1000})
             AND coalesce(reason, '') NOT LIKE 'replayed from changelog %'`.execute(dbB);
          if (r.rows[0]?.at) rtoMs = r.rows[0].at.getTime() - killedAt;
          return rtoMs !== null;
        },
        o.timeoutS * 1000,
      );
    const expected = [...Array(o.tasks).keys()].map((i) => `demo-${String(i).padStart(4, '0')}`);
    const healthy = expected.filter((id) => !diverged.has(id));
    let waitingFor = '';
    await waitUntil(
      `${healthy.length} tasks complete in region B`,
      async () => {
        const done = await dbB
          .selectFrom('task_state')
          .select('task_id')
          .where('status', '=', 'complete')
          .where('task_id', 'like', 'demo-%')
          .execute();
        const ids = new Set(done.map((d) => d.task_id));
        const outbox = await sql<{
          n: number;
        }>`SELECT count(*)::int AS n FROM outbox WHERE topic <> ${witnessTopic}`.execute(dbB);
        waitingFor = `open: ${healthy.filter((id) => !ids.has(id)).join(', ') || 'none'}; outbox rows: ${outbox.rows[0]!.n}`;
        return healthy.every((id) => ids.has(id)) && outbox.rows[0]!.n === 0;
      },
      o.timeoutS * 1000,
    ).catch((err: Error) => {
      throw new Error(waitingFor ? `${err.message} (${waitingFor})` : err.message, { cause: err });
    });
    o.log(
      `[failover] region B: promoted in ${promotedAt - killedAt} ms, checked in ${checkedAt - promotedAt} ms, ` +
        `${resumed} tasks resumed in ${resumedAt - checkedAt} ms, first transition ${rtoMs} ms after the kill, ` +
        `${healthy.length} tasks complete ${Date.now() - killedAt} ms after it`,
    );
    for (const c of procs) await sigterm(c, 5000);

    // --- verify -------------------------------------------------------------------------------
    const checks = await verifyDemo(dbB, sink, healthy.length, {
      only: (id) => id.startsWith('demo-') && !diverged.has(id),
    });
    checks.push(
      ...(await effectChecks(dbB, sink, {
        held: diverged,
        rebuilt: replay.report.rebuilt,
        rpoZero: o.mode === 'sync' ? { report, witnessLost } : undefined,
      })),
    );

    // --- the truth, from region A's own data folder (and broker) ---------------------------------
    const truth = await regionATruth(root, atPromotion, report, o.log, {
      held: [...diverged],
      rebuilt: replay.rebuilt,
    });
    checks.push({
      name: 'rebuilt tasks: state digest as in region A',
      expected: `${replay.rebuilt.size} equal`,
      actual: `${replay.rebuilt.size - truth.digestMismatched.length} equal`,
      violations: truth.digestMismatched.length,
    });
    let unmirrored: number | null = null;
    if (regionB) {
      const m = await mirrorTruth(readerA, kafkaB, allTopics, report);
      unmirrored = m.unmirrored;
      checks.push(...m.checks);
      o.log(`[failover] region A's broker: ${unmirrored} messages never reached the mirror`);
    }
    if (o.mode === 'async') {
      // The witness's lost writes must show in region A's data too (the harness checks itself).
      const missed = witnessLost > 0 && !truth.tasksBehind.some((id) => id.startsWith('witness-')) ? 1 : 0;
      checks.push({
        name: 'flagged tasks really lost something (region A data)',
        expected: '0 false',
        actual: `${truth.falselyFlagged.length} false`,
        violations: truth.falselyFlagged.length + missed,
      });
    }
    const violations = checks.reduce((n, c) => n + c.violations, 0);
    return {
      mode: o.mode,
      tasks: o.tasks,
      resumable,
      rtoMs,
      promoteMs: promotedAt - killedAt,
      checkMs: checkedAt - promotedAt,
      resumeMs: resumedAt - checkedAt,
      report,
      changelog: {
        rebuilt: replay.report.rebuilt.map((r) => r.taskId),
        incomplete: replay.report.incomplete.map((i) => i.taskId),
        refused: replay.report.refused.length,
        replayMs: replay.ms,
      },
      held: [...diverged].sort(),
      witness: { acked: witness.count(), lost: witnessLost, lostAfterReplay: witnessStillLost },
      truth,
      resumed,
      unmirrored,
      checks,
      violations,
    };
  } finally {
    for (const c of procs) await sigkill(c);
    for (const d of dbs) await d.destroy().catch(() => {});
    for (const s of servers) await s.stop();
    await sink?.close();
    await readerA?.close().catch(() => {});
    if (readerB !== readerA) await readerB?.close().catch(() => {});
    await regionB?.stop();
    rmSync(root, { recursive: true, force: true });
  }
}
