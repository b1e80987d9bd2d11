/**
 * The changelog half of the failover harness (issue 20): region A's agents, task creation and
 * witness write every committed version to a changelog topic, signed with a key ring the run
 * makes; after promotion region B replays from it what it lost, before the check. What the
 * replay rebuilt is snapshotted (state digest per task) before region B's agents start, for
 * the comparison with region A's own data (evidence.ts).
 */
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import type { KeyRing } from '../../src/checkpoints/signing.js';
import type { Db } from '../../src/db/database.js';
import type { KafkaAdmin } from '../../src/kafka/admin.js';
import { type ReplayReport, replayChangelog } from '../../src/recovery/replayChangelog.js';
import { stateDigest } from '../../src/state/changelog.js';
import type { Check } from '../demo/verify.js';
import type { Sink } from '../lib/effectSink.js';

/**
 * The run's signing key ring: CAIRN_CHECKPOINT_KEYS's form (`kid:secret`) for the processes,
 * and as a KeyRing for the harness's own stores and the replay. Checkpoints are signed too.
 */
export function runKeyRing(run: string): { env: string; ring: KeyRing } {
  const kid = `failover-${run}`.replace(/[^A-Za-z0-9_.-]/g, '-');
  const secret = randomBytes(24).toString('hex');
  return { env: `${kid}:${secret}`, ring: { current: kid, keys: { [kid]: Buffer.from(secret) } } };
}

/**
 * `--changelog-gap`: once armed (after the cut, so region B never sees the arming), region A
 * drops the next changelog record of `witness-0` from its outbox (the transition commits, its
 * record never exists) and keeps the later ones, so that region B's replay finds a gap in that
 * task's records and must hold it. The trigger is installed before anything runs: created
 * after the cut, it waited for the lock of an agent frozen inside a transaction that had
 * written the outbox, and every outbox write queued behind it (the run hung).
 */
export async function installChangelogGap(db: Db, topic: string): Promise<{ arm: () => Promise<void> }> {
  // A trigger's arguments are literals in its definition: the topic is [a-z0-9.-] (topicOf).
  if (!/^[a-z0-9.-]+$/.test(topic)) throw new Error(`unexpected changelog topic ${topic}`);
  await sql`CREATE TABLE failover_gap (task_id text PRIMARY KEY, version bigint)`.execute(db);
  await sql`
    CREATE FUNCTION failover_gap() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.topic = TG_ARGV[0] AND NEW.task_id = 'witness-0'
         AND EXISTS (SELECT 1 FROM failover_gap WHERE task_id = 'armed')
         AND NOT EXISTS (SELECT 1 FROM failover_gap WHERE task_id = NEW.task_id) THEN
        INSERT INTO failover_gap VALUES (NEW.task_id, NEW.task_version);
        RETURN NULL;
      END IF;
      RETURN NEW;
    END $$`.execute(db);
  await sql`CREATE TRIGGER failover_gap BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION failover_gap(${sql.lit(topic)})`.execute(
    db,
  );
  return {
    arm: async () => {
      await sql`INSERT INTO failover_gap (task_id) VALUES ('armed')`.execute(db);
    },
  };
}

/** A rebuilt task as region B held it right after the replay. */
export interface RebuiltDigest {
  version: number;
  digest: string;
}

export interface ChangelogReplay {
  report: ReplayReport;
  ms: number;
  /** Per rebuilt task: its version and state digest in region B right after the replay. */
  rebuilt: Map<string, RebuiltDigest>;
}

/** Replays the changelog into the promoted database and snapshots what it rebuilt. */
export async function replayIntoRegionB(
  db: Db,
  kafka: KafkaAdmin,
  o: { topic: string; keyRing: KeyRing; sourcePrefix?: string; log: (line: string) => void },
): Promise<ChangelogReplay> {
  const started = Date.now();
  const report = await replayChangelog(db, kafka, {
    topic: o.topic,
    keyRing: o.keyRing,
    actor: 'spiffe://demo.cairn.local/failover/operator',
    ...(o.sourcePrefix ? { sourcePrefix: o.sourcePrefix } : {}),
  });
  const ms = Date.now() - started;
  const ids = report.rebuilt.map((r) => r.taskId);
  const rows = ids.length
    ? await db
        .selectFrom('task_state')
        .select(['task_id', 'version', 'doc'])
        .where('task_id', 'in', ids)
        .execute()
    : [];
  const rebuilt = new Map(rows.map((r) => [r.task_id, { version: r.version, digest: stateDigest(r.doc) }]));
  o.log(
    `[failover] changelog replay (${o.topic}) in ${ms} ms: ${report.rebuilt.length} tasks rebuilt, ` +
      `${report.incomplete.length} incomplete, ${report.refused.length} records refused, ${report.upToDate} up to date; ` +
      `${report.restoredInboxRows} inbox rows and ${report.restoredReceipts} receipts restored` +
      (report.incomplete.length
        ? `; incomplete: ${report.incomplete.map((i) => `${i.taskId} (${i.reason})`).join('; ')}`
        : ''),
  );
  return { report, ms, rebuilt };
}

/**
 * Rebuilt demo tasks went on in region B: each is complete and the sink saw one idempotency
 * key for its deploy, applied once (whether the deploy ran in region A before the loss, its
 * receipt restored by the replay, or in region B after it).
 */
export async function rebuiltTasksDone(db: Db, sink: Sink, rebuilt: ReplayReport['rebuilt']): Promise<Check> {
  const ids = rebuilt.map((r) => r.taskId).filter((id) => id.startsWith('demo-'));
  const complete = new Set(
    ids.length
      ? (
          await db
            .selectFrom('task_state')
            .select('task_id')
            .where('status', '=', 'complete')
            .where('task_id', 'in', ids)
            .execute()
        ).map((r) => r.task_id)
      : [],
  );
  const bad = ids.filter((id) => {
    const keys = [...(sink.keysByOperation.get(id) ?? [])];
    return !complete.has(id) || keys.length !== 1 || (sink.applied.get(keys[0]!) ?? 0) !== 1;
  }).length;
  return {
    name: 'rebuilt tasks complete, deploy once (sink)',
    expected: `${ids.length} tasks`,
    actual: `${ids.length - bad} tasks`,
    violations: bad,
  };
}
