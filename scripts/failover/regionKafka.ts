/**
 * Region B's own Kafka for the failover harness (`--kafka per-region`): a single-node KRaft
 * broker from the same Maven jars as the local stack, with its own data folder under the
 * harness's temp folder, fed from region A's broker by MirrorMaker 2 in dedicated mode
 * (`org.apache.kafka.connect.mirror.MirrorMaker`, from connect-mirror 3.9.1, checked in the
 * jar). Every key of mm2.properties below was checked against the 3.9.1 config classes
 * (MirrorSourceConfig, MirrorCheckpointConfig, MirrorHeartbeatConfig, MirrorMakerConfig).
 *
 * Mirrored topics on B are named `A.<topic>` (DefaultReplicationPolicy), with A's partition
 * count and records in A's order per partition; group offsets are translated through
 * MirrorMaker's offset syncs and checkpoints and written to B's groups (sync.group.offsets)
 * while those groups are empty on B, i.e. until region B's agents start.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { closeSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  fetchJars,
  java,
  kafkaAnswers,
  newClusterId,
  nodeProperties,
  writeLog4j,
} from '../../cli/stack/kafka.js';
import { ensureDir } from '../../cli/stack/paths.js';

export const REGION_B_PORT = Number(process.env.CAIRN_FAILOVER_B_PORT ?? 19892);
/** The source cluster's alias: mirrored topics on B are `${SOURCE_ALIAS}.<topic>`. */
export const SOURCE_ALIAS = 'A';
export const MIRROR_PREFIX = `${SOURCE_ALIAS}.`;

export interface RegionKafka {
  /** Region B's bootstrap address. */
  brokers: string;
  /** Stops mirroring at once (SIGKILL): what was not mirrored yet never reaches B. */
  killMirror(): void;
  /** Pauses (SIGSTOP) or resumes (SIGCONT) MirrorMaker: lag on demand. */
  pauseMirror(paused: boolean): void;
  /** MirrorMaker's log, for a failure message. */
  mirrorLog: string;
  stop(): Promise<void>;
}

const waitExit = (c: ChildProcess) =>
  new Promise<void>((r) => (c.exitCode !== null || c.signalCode !== null ? r() : c.once('exit', () => r())));

function spawnJava(name: string, args: string[], logFile: string): ChildProcess {
  const out = openSync(logFile, 'a');
  const child = spawn('java', java(args, { log4j: true }), { stdio: ['ignore', out, out] });
  closeSync(out);
  if (!child.pid) throw new Error(`could not spawn java for ${name}: is a JDK 17+ on PATH?`);
  return child;
}

/**
 * Starts region B's broker (client port REGION_B_PORT, controller the next one) and a
 * MirrorMaker 2 process A->B mirroring the topics matching `topicsRegex`.
 */
export async function startRegionKafka(o: {
  root: string;
  sourceBrokers: string;
  topicsRegex: string;
  log: (line: string) => void;
}): Promise<RegionKafka> {
  const dir = join(o.root, 'kafka-b');
  ensureDir(join(dir, 'data'));
  fetchJars(o.log);
  writeLog4j();
  const brokers = `127.0.0.1:${REGION_B_PORT}`;
  if (await kafkaAnswers(brokers, 1500)) {
    throw new Error(
      `something already answers as Kafka on ${brokers}: set CAIRN_FAILOVER_B_PORT to a free port`,
    );
  }
  const config = join(dir, 'server.properties');
  writeFileSync(
    config,
    nodeProperties({
      nodeId: 1,
      port: REGION_B_PORT,
      controllerPort: REGION_B_PORT + 1,
      voters: `1@127.0.0.1:${REGION_B_PORT + 1}`,
      dataDir: join(dir, 'data'),
      brokers: 1,
    }),
  );
  execFileSync(
    'java',
    java(['kafka.tools.StorageTool', 'format', `--cluster-id=${newClusterId()}`, '-c', config], {
      log4j: true,
    }),
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  const children: ChildProcess[] = [];
  const broker = spawnJava('region B broker', ['kafka.Kafka', config], join(dir, 'broker.log'));
  children.push(broker);
  const stop = async () => {
    for (const c of children.reverse()) {
      if (c.exitCode === null && c.signalCode === null) {
        c.kill('SIGCONT');
        c.kill('SIGKILL');
        await waitExit(c);
      }
    }
  };
  try {
    const until = Date.now() + 120_000;
    while (!(await kafkaAnswers(brokers, 2000))) {
      if (broker.exitCode !== null)
        throw new Error(`region B's broker exited; see ${join(dir, 'broker.log')}`);
      if (Date.now() > until) throw new Error(`region B's broker did not answer within 120 s`);
      await new Promise((r) => setTimeout(r, 300));
    }
    const mm2 = join(dir, 'mm2.properties');
    writeFileSync(
      mm2,
      [
        `clusters=${SOURCE_ALIAS},B`,
        `${SOURCE_ALIAS}.bootstrap.servers=${o.sourceBrokers}`,
        `B.bootstrap.servers=${brokers}`,
        `${SOURCE_ALIAS}->B.enabled=true`,
        `${SOURCE_ALIAS}->B.topics=${o.topicsRegex}`,
        `B->${SOURCE_ALIAS}.enabled=false`,
        'tasks.max=1',
        // One broker in region B: every internal topic with one replica.
        'replication.factor=1',
        'checkpoints.topic.replication.factor=1',
        'heartbeats.topic.replication.factor=1',
        'offset-syncs.topic.replication.factor=1',
        'offset.storage.replication.factor=1',
        'status.storage.replication.factor=1',
        'config.storage.replication.factor=1',
        // Group offsets translated and written to B's (still empty) groups every second.
        'sync.group.offsets.enabled=true',
        'sync.group.offsets.interval.seconds=1',
        'emit.checkpoints.interval.seconds=1',
        'refresh.topics.interval.seconds=1',
        'refresh.groups.interval.seconds=1',
        // An offset sync for every record: translated offsets are exact, not up to 100 behind.
        'offset.lag.max=0',
        '',
      ].join('\n'),
    );
    const mirrorLog = join(dir, 'mirrormaker.log');
    const mirror = spawnJava(
      'MirrorMaker 2',
      ['org.apache.kafka.connect.mirror.MirrorMaker', mm2],
      mirrorLog,
    );
    children.push(mirror);
    o.log(
      `[failover] region B's broker on ${brokers} (pid ${broker.pid}), MirrorMaker 2 A->B (pid ${mirror.pid})`,
    );
    return {
      brokers,
      mirrorLog,
      killMirror: () => {
        mirror.kill('SIGCONT');
        mirror.kill('SIGKILL');
      },
      pauseMirror: (paused) => {
        mirror.kill(paused ? 'SIGSTOP' : 'SIGCONT');
      },
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** The last lines of a log file (for an error message). */
export const tailOf = (file: string, lines = 15) => {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
};
