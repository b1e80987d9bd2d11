/**
 * A single-node KRaft Apache Kafka broker run from its jars on Maven Central, for machines
 * without Docker. Facts this relies on (checked on the dev machine, 2026-11-29):
 * - `org.apache.kafka:kafka_2.13:3.9.1` resolves with all runtime jars through
 *   maven-dependency-plugin 3.6.1 `copy-dependencies`; the POM brings no logging binding,
 *   so cli/stack/kafka/pom.xml adds slf4j-reload4j + reload4j (3.9 logs through log4j 1.x).
 * - 3.9.x rather than 4.x: kafkajs 2.2.4 (its last release) is known to work against 3.x;
 *   4.x dropped old protocol versions (KIP-896).
 * - The broker is ready when a kafkajs admin client can list topics.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  closeSync,
  existsSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { Kafka, logLevel } from 'kafkajs';
import { assertMayStopTheSharedBroker } from './brokerGuard.js';
import { ensureDir, kafkaPaths } from './paths.js';

export const KAFKA_VERSION = '3.9.1';
export const kafkaPort = Number(process.env.CAIRN_KAFKA_PORT ?? 19092);
export const controllerPort = Number(process.env.CAIRN_KAFKA_CONTROLLER_PORT ?? kafkaPort + 1);
export const localBrokers = `127.0.0.1:${kafkaPort}`;

// Generous: on a starved machine a cold start took 55 s, and a start after an unclean stop
// waits a broker session (60 s, see writeConfig) on top.
const READY_DEADLINE_MS = Number(process.env.CAIRN_KAFKA_START_TIMEOUT_MS ?? 240_000);

/** True when the broker at `brokers` answers a metadata request within `timeoutMs`. */
export async function kafkaAnswers(brokers: string, timeoutMs = 3000): Promise<boolean> {
  const kafka = new Kafka({
    clientId: 'cairn-stack-probe',
    brokers: brokers.split(','),
    logLevel: logLevel.NOTHING,
    connectionTimeout: timeoutMs,
    requestTimeout: timeoutMs,
    retry: { retries: 0 },
  });
  const admin = kafka.admin();
  try {
    await withTimeout(admin.connect(), timeoutMs);
    await withTimeout(admin.listTopics(), timeoutMs);
    return true;
  } catch {
    return false;
  } finally {
    await admin.disconnect().catch(() => {});
  }
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

export function readPid(): number | undefined {
  if (!existsSync(kafkaPaths.pid)) return undefined;
  const pid = Number(readFileSync(kafkaPaths.pid, 'utf8').trim());
  return Number.isInteger(pid) && pid > 0 ? pid : undefined;
}

export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Fetches the broker's jars with Maven once; later runs reuse `.cairn/kafka/libs` and `~/.m2`. */
export function fetchJars(log: (line: string) => void): void {
  // The folder is complete when it holds the broker and MirrorMaker 2 (added later: a folder
  // fetched before that lacks it and is fetched again).
  const markers = [`kafka_2.13-${KAFKA_VERSION}.jar`, `connect-mirror-${KAFKA_VERSION}.jar`];
  if (existsSync(kafkaPaths.libs) && markers.every((m) => readdirSync(kafkaPaths.libs).includes(m))) return;
  log(`fetching Apache Kafka ${KAFKA_VERSION} jars from Maven Central (first run only)...`);
  rmSync(kafkaPaths.libs, { recursive: true, force: true });
  ensureDir(kafkaPaths.libs);
  try {
    execFileSync(
      'mvn',
      [
        '-B',
        '-q',
        '-f',
        kafkaPaths.pom,
        'org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies',
        '-DincludeScope=runtime',
        `-DoutputDirectory=${kafkaPaths.libs}`,
      ],
      { stdio: ['ignore', 'inherit', 'inherit'] },
    );
  } catch (err) {
    rmSync(kafkaPaths.libs, { recursive: true, force: true });
    throw new Error(
      `could not fetch the Kafka jars with Maven (${(err as Error).message}). Cairn needs 'mvn' and 'java' (17+) ` +
        'on PATH and access to Maven Central, or set KAFKA_BROKERS to a broker you run yourself.',
    );
  }
}

/** One KRaft node's settings: its id, ports, data folder, and the cluster's voters and sizes. */
export interface NodeConfig {
  nodeId: number;
  port: number;
  controllerPort: number;
  /** `id@host:port` of every controller in the cluster. */
  voters: string;
  dataDir: string;
  /** Brokers in the cluster: replication of internal topics and of topics created without a factor. */
  brokers: number;
}

/** server.properties of one node (combined broker and controller). */
export function nodeProperties(c: NodeConfig): string {
  const replication = Math.min(3, c.brokers);
  // With 3 replicas an acknowledged write (acks=all) is on at least 2 of them.
  const minIsr = replication >= 3 ? 2 : 1;
  return [
    'process.roles=broker,controller',
    `node.id=${c.nodeId}`,
    `controller.quorum.voters=${c.voters}`,
    `listeners=PLAINTEXT://127.0.0.1:${c.port},CONTROLLER://127.0.0.1:${c.controllerPort}`,
    // 127.0.0.1, never localhost: Node may resolve localhost to ::1 (kafkajs issue 1299).
    `advertised.listeners=PLAINTEXT://127.0.0.1:${c.port}`,
    'controller.listener.names=CONTROLLER',
    'inter.broker.listener.name=PLAINTEXT',
    'listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT',
    `log.dirs=${c.dataDir}`,
    // Internal topics replicated like the cluster (a single node: factor 1, or groups never
    // find a coordinator); topics created without a factor get the same.
    `offsets.topic.replication.factor=${replication}`,
    'offsets.topic.num.partitions=3',
    `transaction.state.log.replication.factor=${replication}`,
    `transaction.state.log.min.isr=${minIsr}`,
    'transaction.state.log.num.partitions=1',
    `default.replication.factor=${replication}`,
    `min.insync.replicas=${minIsr}`,
    // Never elect a replica that missed acknowledged writes (the default, said out loud).
    'unclean.leader.election.enable=false',
    'num.partitions=3',
    'group.initial.rebalance.delay.ms=0',
    // Crash tests kill consumers; a short minimum session lets the group notice in ~2 s, not 6+.
    'group.min.session.timeout.ms=1000',
    // The node's broker half heartbeats to the controller. On a starved machine (the chaos soak
    // under CPU hogs) heartbeats came more than the default 9 s late, and even 30 s late at a
    // load average of 100+, and the controller fenced its only broker ("Fencing broker 1
    // because its session has timed out"): every partition lost its leader and every group its
    // coordinator until it was unfenced. With one broker there is nobody to fail over to, so
    // the session is long; in a cluster a dead broker's partitions must move within seconds.
    `broker.session.timeout.ms=${c.brokers > 1 ? 12000 : 60000}`,
    // The cost: after an unclean stop (SIGKILL) the restarted controller keeps the old
    // registration alive for a session and refuses the new one ("Another broker is
    // registered with that broker id"). With the default 60 s to register, a broker with a
    // 60 s session gave up and exited; it may now take 5 minutes.
    'initial.broker.registration.timeout.ms=300000',
    'auto.create.topics.enable=true',
    'log.retention.hours=24',
    'log.segment.bytes=67108864',
    'num.network.threads=2',
    'num.io.threads=4',
    '',
  ].join('\n');
}

/** The broker's log4j settings (3.9 logs through log4j 1.x), shared by every node. */
export function writeLog4j(): void {
  writeFileSync(
    kafkaPaths.log4j,
    [
      'log4j.rootLogger=INFO, stdout',
      'log4j.appender.stdout=org.apache.log4j.ConsoleAppender',
      'log4j.appender.stdout.layout=org.apache.log4j.PatternLayout',
      'log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n',
      'log4j.logger.kafka=INFO',
      'log4j.logger.org.apache.kafka=INFO',
      'log4j.logger.state.change.logger=WARN',
      'log4j.logger.kafka.log.LogCleaner=WARN',
      '',
    ].join('\n'),
  );
}

function writeConfig(): void {
  ensureDir(kafkaPaths.data);
  writeFileSync(
    kafkaPaths.config,
    nodeProperties({
      nodeId: 1,
      port: kafkaPort,
      controllerPort,
      voters: `1@127.0.0.1:${controllerPort}`,
      dataDir: kafkaPaths.data,
      brokers: 1,
    }),
  );
  writeLog4j();
}

export function java(args: string[], opts: { log4j?: boolean } = {}): string[] {
  const jvm = ['-Xms256m', '-Xmx512m', '-XX:+UseG1GC', '-Djava.awt.headless=true'];
  if (opts.log4j) jvm.push(`-Dlog4j.configuration=file:${kafkaPaths.log4j}`);
  return [...jvm, '-cp', `${kafkaPaths.libs}/*`, ...args];
}

/**
 * A cluster id as Kafka makes them (16 random bytes, base64url), never starting with '-': the
 * storage tool's argument parser read such an id as an option ("argument --cluster-id/-t:
 * expected one argument"), one start in 64 failed. The id is also passed as --cluster-id=<id>
 * so that a file written before this still works.
 */
export function newClusterId(): string {
  for (;;) {
    const id = randomBytes(16).toString('base64url');
    if (!id.startsWith('-')) return id;
  }
}

/** Formats a node's storage for `clusterId` (a no-op when it is already formatted). */
export function formatNode(config: string, clusterId: string): void {
  execFileSync(
    'java',
    java(
      ['kafka.tools.StorageTool', 'format', `--cluster-id=${clusterId}`, '-c', config, '--ignore-formatted'],
      {
        log4j: true,
      },
    ),
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
}

function formatStorage(): void {
  if (!existsSync(kafkaPaths.clusterId)) writeFileSync(kafkaPaths.clusterId, newClusterId());
  formatNode(kafkaPaths.config, readFileSync(kafkaPaths.clusterId, 'utf8').trim());
}

/**
 * Starts a broker JVM for `config`, detached, its output in `logFile` (the previous one kept
 * as `<log>.1`, so the tail shows this start) and its pid in `pidFile`; returns the child.
 */
export function spawnBroker(
  config: string,
  logFile: string,
  pidFile: string,
): ChildProcess & { pid: number } {
  if (existsSync(logFile)) renameSync(logFile, `${logFile}.1`);
  const out = openSync(logFile, 'a');
  const child = spawn('java', java(['kafka.Kafka', config], { log4j: true }), {
    detached: true,
    stdio: ['ignore', out, out],
  });
  closeSync(out);
  if (!child.pid) throw new Error('could not spawn java: is a JDK 17+ on PATH?');
  writeFileSync(pidFile, String(child.pid));
  child.unref();
  return child as ChildProcess & { pid: number };
}

/**
 * The first errors of the broker's log (with the line after each, which holds the exception
 * message, e.g. "Socket server failed to bind to 127.0.0.1:19092: Address already in use"),
 * then its last lines: a failed start ends with pages of shutdown noise after the cause.
 */
export function logTail(lines = 20): string {
  if (!existsSync(kafkaPaths.log)) return '(no broker log yet)';
  const all = readFileSync(kafkaPaths.log, 'utf8').trimEnd().split('\n');
  const firstErrors: string[] = [];
  for (let i = 0; i < all.length && firstErrors.length < 6; i++) {
    if (/\] (ERROR|FATAL) /.test(all[i]!)) firstErrors.push(all[i]!, all[i + 1] ?? '');
  }
  const tail = all.slice(-lines).join('\n');
  return firstErrors.length > 0 ? `${firstErrors.join('\n')}\n...\n${tail}` : tail;
}

/**
 * Starts the local broker unless it already runs. Resolves when kafkajs can list topics;
 * rejects with the broker log's tail when the JVM exits or the deadline passes.
 */
export async function startLocalKafka(log: (line: string) => void): Promise<{ started: boolean }> {
  const pid = readPid();
  if (pid && isAlive(pid) && (await kafkaAnswers(localBrokers))) return { started: false };
  if (pid && isAlive(pid)) {
    // A broker process we started is alive but not answering yet (still booting): wait for it.
    await waitReady(undefined, log);
    return { started: false };
  }
  if (await kafkaAnswers(localBrokers, 1500)) {
    throw new Error(
      `something already answers as Kafka on ${localBrokers} but it is not the broker Cairn started. ` +
        'Set KAFKA_BROKERS=127.0.0.1:' +
        kafkaPort +
        ' to use it, or CAIRN_KAFKA_PORT to pick another port.',
    );
  }
  ensureDir(kafkaPaths.root);
  fetchJars(log);
  writeConfig();
  formatStorage();
  const child = spawnBroker(kafkaPaths.config, kafkaPaths.log, kafkaPaths.pid);
  log(`starting Kafka ${KAFKA_VERSION} (pid ${child.pid}) on ${localBrokers}, log: ${kafkaPaths.log}`);
  await waitReady(child, log);
  return { started: true };
}

async function waitReady(child: ChildProcess | undefined, log: (line: string) => void): Promise<void> {
  const started = Date.now();
  let exited: number | null | undefined;
  child?.once('exit', (code) => {
    exited = code;
  });
  while (Date.now() - started < READY_DEADLINE_MS) {
    if (exited !== undefined) {
      throw new Error(
        `the Kafka broker exited (code ${exited}) before it was ready. Last log lines:\n${logTail()}`,
      );
    }
    const pid = readPid();
    if (pid && !isAlive(pid)) {
      throw new Error(
        `the Kafka broker (pid ${pid}) died before it was ready. Last log lines:\n${logTail()}`,
      );
    }
    if (await kafkaAnswers(localBrokers, 2000)) {
      log(`Kafka ready on ${localBrokers} after ${((Date.now() - started) / 1000).toFixed(1)} s`);
      return;
    }
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error(
    `the Kafka broker did not answer on ${localBrokers} within ${READY_DEADLINE_MS / 1000} s. Last log lines:\n${logTail()}`,
  );
}

/**
 * The line a run that used the project's local broker ends with: the broker outlives the run
 * (so the next one does not wait 10+ s for a JVM), and here is how to stop it. Undefined when
 * the run used another broker, or the local one is not running (any more).
 */
export function localBrokerStillRunning(
  usedBrokers: string,
  opts: { startedByThisRun: boolean },
): string | undefined {
  if (!usedBrokers.split(',').includes(localBrokers)) return undefined;
  const pid = readPid();
  if (pid === undefined || !isAlive(pid)) return undefined;
  return opts.startedByThisRun
    ? `this run started the Kafka broker on ${localBrokers} (pid ${pid}); it is still running, ready for the next run. Stop it with \`npm run stack:down\``
    : `the local stack's Kafka broker on ${localBrokers} (pid ${pid}) is still running. Stop it with \`npm run stack:down\``;
}

/** Sends the broker this stack started a signal (SIGSTOP: frozen; SIGCONT: going again). */
export function signalLocalKafka(signal: NodeJS.Signals): void {
  assertMayStopTheSharedBroker(`signalLocalKafka(${signal})`);
  const pid = readPid();
  if (!pid || !isAlive(pid)) throw new Error(`signalLocalKafka(${signal}): the local broker is not running`);
  process.kill(pid, signal);
}

/**
 * Stops the broker this stack started: SIGTERM for a controlled shutdown, SIGKILL after
 * `graceMs` (default 2 minutes: a killed broker registers again only a session later).
 */
export async function stopLocalKafka(
  opts: { graceMs?: number; signal?: NodeJS.Signals } = {},
): Promise<boolean> {
  assertMayStopTheSharedBroker('stopLocalKafka');
  const pid = readPid();
  if (!pid || !isAlive(pid)) {
    rmSync(kafkaPaths.pid, { force: true });
    return false;
  }
  process.kill(pid, opts.signal ?? 'SIGTERM');
  const deadline = Date.now() + (opts.graceMs ?? 120_000);
  while (isAlive(pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
  if (isAlive(pid)) process.kill(pid, 'SIGKILL');
  while (isAlive(pid)) await new Promise((r) => setTimeout(r, 50));
  rmSync(kafkaPaths.pid, { force: true });
  return true;
}
