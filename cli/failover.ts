import { parseArgs } from 'node:util';
import { kafkaBrokersFromEnv } from '../src/env.js';
import { createKafkaAdmin, type KafkaAdmin } from '../src/kafka/admin.js';
import { checkAfterFailover, quarantine, releaseQuarantine } from '../src/recovery/failover.js';
import { holdDiverged } from '../src/recovery/failoverHold.js';
import { replayChangelog } from '../src/recovery/replayChangelog.js';
import { CHANGELOG_TOPIC } from '../src/state/changelog.js';
import { checkpointKeysFromEnv } from './checkpointKeys.js';
import { line, printResult, UsageError } from './output.js';
import { withDb } from './withDb.js';

const usage = `usage:
  cairn failover check --topics T1,T2 [--group G=T1,T2 ...] [--source-prefix A.] [--inbox-retention-hours H] [--hold] [--json]
    Run on the promoted database before anything resumes: reports transitions a published
    message carries that the database lacks, and messages each group committed past without
    an inbox row here. Exit 1 if anything was lost, or if the check could not judge everything
    (a group without translated offsets, a topic that moved while it ran). --hold quarantines
    those tasks: no transition and no new side effect until released; a task released after
    an earlier check stays released unless the check finds something new for it.
    --source-prefix A.: KAFKA_BROKERS is this region's own cluster, a MirrorMaker 2 mirror of the
    lost region's; --topics and --group name the mirrored topics (A.T1; an unprefixed name is
    refused), and this region's own topics (T1) are read too when they exist. Also reports messages
    the database says were published that the mirror lacks (published, never mirrored), as far
    as checkpoints tell: a task without a checkpoint at its version is not judged. Stop
    MirrorMaker first: a message it copies after the check is not a loss. A message published
    in the lost region that this database has no trace of cannot be seen from here at all.
    --inbox-retention-hours H: with --source-prefix, the shortest inbox retention of the
    consumers on this database (default 168, their default): only a message older than that may
    be missing from the inbox because pruning removed its row.
  cairn failover replay [--from-topic cairn.changelog] [--source-prefix A.] [--tenant T] [--hold] [--json]
    Run on the promoted database before the check: re-applies, from the changelog topic, each
    task's versions this database lost (verified: chain of state digests, the resulting digest,
    the signature with CAIRN_CHECKPOINT_KEYS, decrypted with CAIRN_KEYRING), restoring the
    inbox rows and receipts they name. A task it cannot prove (a gap, a bad digest or
    signature, a message of its never published) is left as it is and reported; --hold
    quarantines it. Run it again any time: what is already here is skipped. Exit 1 if a task
    could not be rebuilt. Then run \`cairn failover check\`.
  cairn failover release <task> [--actor spiffe://...] [--json]`;

export async function failoverCommand(argv: string[]): Promise<number> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      topics: { type: 'string' },
      group: { type: 'string', multiple: true },
      json: { type: 'boolean' },
      hold: { type: 'boolean' },
      'source-prefix': { type: 'string' },
      'inbox-retention-hours': { type: 'string' },
      'from-topic': { type: 'string', default: CHANGELOG_TOPIC },
      tenant: { type: 'string' },
      actor: { type: 'string', default: `spiffe://cairn.local/operator/${process.env.USER ?? 'unknown'}` },
    },
  });
  if (positionals[0] === 'release' && positionals[1]) {
    const task = positionals[1];
    return withDb(async (db) => {
      const n = await releaseQuarantine(db, task, values.actor!);
      printResult(values.json, { task_id: task, released: n > 0 }, () =>
        console.log(n ? `${task}: released` : `${task}: not quarantined`),
      );
      return n ? 0 : 1;
    });
  }
  if (positionals[0] === 'replay') return replayCommand(values);
  if (positionals[0] !== 'check' || !values.topics) throw new UsageError(`\n${usage}`);
  const topics = values.topics.split(',').filter(Boolean);
  const consumers = (values.group ?? []).map((g) => {
    const [groupId, list] = g.split('=');
    if (!groupId || !list) {
      throw new UsageError(`--group must be <group>=<topic>,<topic> (got ${JSON.stringify(g)})`);
    }
    return { groupId, topics: list.split(',').filter(Boolean) };
  });
  const retentionHours = values['inbox-retention-hours'];
  // In whole milliseconds, at least one: a value that rounds to 0 or past a safe integer is a usage error too.
  const retentionMs =
    retentionHours === undefined ? undefined : Math.round(Number(retentionHours) * 3_600_000);
  if (retentionMs !== undefined && !(Number.isSafeInteger(retentionMs) && retentionMs >= 1)) {
    throw new UsageError(
      `--inbox-retention-hours must be a positive number of hours (got ${JSON.stringify(retentionHours)})`,
    );
  }
  return withDb(async (db) => {
    const r = await withAdmin('cairn-failover-check', (kafka) =>
      checkAfterFailover(db, kafka, {
        topics,
        consumers,
        ...(values['source-prefix'] ? { sourcePrefix: values['source-prefix'] } : {}),
        ...(retentionMs !== undefined ? { inboxRetentionMs: retentionMs } : {}),
      }),
    );
    const hold = values.hold
      ? await holdDiverged(db, r, { actor: values.actor! })
      : { held: [], keptReleased: [] };
    const held = hold.held.length;
    const incomplete = r.groupsNotJudged.length > 0 || r.movedDuringCheck.length > 0;
    if (values.json)
      console.log(JSON.stringify({ ...r, quarantined: held, keptReleased: hold.keptReleased }, null, 2));
    else {
      for (const l of r.lostTransitions)
        console.log(
          line`lost transition: ${l.taskId} is at version ${l.storedVersion ?? '(missing)'}, ${l.topic} carries version ${l.seenVersion} (${l.messageId})`,
        );
      for (const u of r.unmirroredMessages)
        console.log(
          line`not mirrored: ${u.taskId} at version ${u.version} sent ${u.messageId}, on neither the mirror nor an inbox`,
        );
      for (const c of r.lostConsumptions)
        console.log(
          line`lost consumption: ${c.groupId} committed past ${c.topic}/${c.partition}@${c.offset} (${c.taskId})`,
        );
      for (const g of r.groupsNotJudged)
        console.log(
          line`not judged: ${g.groupId} on ${g.topic} partition(s) ${g.partitions.join(',')}: no translated offset here (MirrorMaker never checkpointed the group to this cluster); what it consumed there is unknown`,
        );
      for (const m of r.movedDuringCheck)
        console.log(
          line`moved during the check: ${m.topic}/${m.partition} ${m.groupId ? `${m.groupId}'s committed offset` : 'end offset'} ${m.before} -> ${m.after}; stop MirrorMaker (and this region's relay and consumers) and run the check again`,
        );
      if (hold.keptReleased.length > 0)
        console.log(
          line`left released (nothing new found since the release): ${hold.keptReleased.join(', ')}`,
        );
      if (incomplete) console.log('the check is incomplete: do not read it as nothing lost');
      console.log(
        r.divergedTasks.length === 0
          ? incomplete
            ? 'no loss found in what could be judged'
            : values['source-prefix']
              ? 'nothing lost that this region can see: the database has everything the mirror holds, and every message its checkpoints name is on the mirror or applied'
              : 'nothing lost: the database has everything the broker saw'
          : // A task id is a tenant's to choose: its control characters reach no terminal.
            line`${values.hold ? `quarantined ${held} task(s)` : 'hold these tasks (--hold)'}: ${r.divergedTasks.join(', ')}`,
      );
    }
    return r.divergedTasks.length === 0 && !incomplete ? 0 : 1;
  }, 2);
}

async function replayCommand(values: {
  'from-topic'?: string;
  'source-prefix'?: string;
  tenant?: string;
  hold?: boolean;
  json?: boolean;
  actor?: string;
}): Promise<number> {
  return withDb(async (db) => {
    const r = await withAdmin('cairn-failover-replay', (kafka) =>
      replayChangelog(db, kafka, {
        topic: values['from-topic']!,
        actor: values.actor!,
        ...checkpointKeysFromEnv(db),
        ...(values['source-prefix'] ? { sourcePrefix: values['source-prefix'] } : {}),
        ...(values.tenant ? { tenant: values.tenant } : {}),
      }),
    );
    const incomplete = r.incomplete.map((i) => i.taskId);
    const held = values.hold
      ? await quarantine(db, incomplete, {
          reason: 'failover replay: the changelog cannot prove what this region lost',
          actor: values.actor!,
        })
      : 0;
    printResult(values.json, { ...r, quarantined: held }, () => {
      for (const t of r.rebuilt) console.log(line`rebuilt: ${t.taskId} (${t.tenantId}) ${t.from} -> ${t.to}`);
      for (const t of r.incomplete)
        console.log(line`not rebuilt: ${t.taskId} (${t.tenantId}) at ${t.from}: ${t.reason}`);
      for (const x of r.refused) console.log(line`refused record ${x.at}: ${x.reason}`);
      console.log(
        line`${r.rebuilt.length} task(s) rebuilt, ${r.upToDate} up to date, ${r.restoredInboxRows} inbox row(s) and ` +
          `${r.restoredReceipts} receipt(s) restored; ${r.incomplete.length} not rebuilt` +
          (r.incomplete.length ? (values.hold ? ` (quarantined ${held})` : ' (hold them: --hold)') : ''),
      );
    });
    return r.incomplete.length === 0 ? 0 : 1;
  }, 2);
}

/** Runs `job` with a KafkaAdmin on KAFKA_BROKERS (the client CAIRN_KAFKA_CLIENT names), closed after. */
async function withAdmin<T>(clientId: string, job: (kafka: KafkaAdmin) => Promise<T>): Promise<T> {
  const kafka = createKafkaAdmin({ brokers: kafkaBrokersFromEnv(), clientId });
  try {
    return await job(kafka);
  } finally {
    await kafka.close().catch(() => {});
  }
}
