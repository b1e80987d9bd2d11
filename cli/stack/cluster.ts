/**
 * A local KRaft cluster of several nodes (each a combined broker and controller) from the same
 * Maven jars as the single broker, for the tests of broker failure. Each node has its own data
 * folder, log and pid file under `.cairn/kafka-cluster/node-<id>`; the ports are
 * CAIRN_KAFKA_CLUSTER_PORT (default 19192) + 2 × (id − 1) for clients and the next one for the
 * controller. Topics created without a replication factor get 3 (`min.insync.replicas=2`).
 */
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Kafka, logLevel } from 'kafkajs';
import {
  fetchJars,
  formatNode,
  isAlive,
  KAFKA_VERSION,
  kafkaAnswers,
  newClusterId,
  nodeProperties,
  spawnBroker,
  writeLog4j,
} from './kafka.js';
import { ensureDir, kafkaPaths, stackDir } from './paths.js';

export const clusterRoot = join(stackDir, 'kafka-cluster');
export const clusterBasePort = Number(process.env.CAIRN_KAFKA_CLUSTER_PORT ?? 19192);
const READY_DEADLINE_MS = Number(process.env.CAIRN_KAFKA_START_TIMEOUT_MS ?? 240_000);

/** One node of the local cluster: where it listens and where it keeps its files. */
export interface ClusterNode {
  id: number;
  address: string;
  port: number;
  controllerPort: number;
  dir: string;
  pidFile: string;
  log: string;
  config: string;
}

export function clusterNodes(size: number): ClusterNode[] {
  return Array.from({ length: size }, (_, i) => {
    const id = i + 1;
    const port = clusterBasePort + 2 * i;
    const dir = join(clusterRoot, `node-${id}`);
    return {
      id,
      address: `127.0.0.1:${port}`,
      port,
      controllerPort: port + 1,
      dir,
      pidFile: join(dir, 'broker.pid'),
      log: join(dir, 'broker.log'),
      config: join(dir, 'server.properties'),
    };
  });
}

/** The bootstrap list of a cluster of `size` nodes. */
export const clusterBrokers = (size: number) =>
  clusterNodes(size)
    .map((n) => n.address)
    .join(',');

export function nodePid(node: ClusterNode): number | undefined {
  if (!existsSync(node.pidFile)) return undefined;
  const pid = Number(readFileSync(node.pidFile, 'utf8').trim());
  return Number.isInteger(pid) && pid > 0 && isAlive(pid) ? pid : undefined;
}

function prepare(nodes: ClusterNode[]): void {
  ensureDir(clusterRoot);
  const idFile = join(clusterRoot, 'cluster-id');
  if (!existsSync(idFile)) writeFileSync(idFile, newClusterId());
  const clusterId = readFileSync(idFile, 'utf8').trim();
  const voters = nodes.map((n) => `${n.id}@127.0.0.1:${n.controllerPort}`).join(',');
  writeLog4j();
  for (const n of nodes) {
    ensureDir(join(n.dir, 'data'));
    writeFileSync(
      n.config,
      nodeProperties({
        nodeId: n.id,
        port: n.port,
        controllerPort: n.controllerPort,
        voters,
        dataDir: join(n.dir, 'data'),
        brokers: nodes.length,
      }),
    );
    formatNode(n.config, clusterId);
  }
}

/** Starts one node's JVM (after a kill, too); does not wait for it. */
export function startNode(node: ClusterNode): number {
  const running = nodePid(node);
  if (running) return running;
  return spawnBroker(node.config, node.log, node.pidFile).pid;
}

/** Kills one node (SIGKILL by default: a broker lost without a controlled shutdown). */
export async function killNode(node: ClusterNode, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
  const pid = nodePid(node);
  if (!pid) return;
  process.kill(pid, signal);
  const deadline = Date.now() + 120_000;
  while (isAlive(pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  if (isAlive(pid)) process.kill(pid, 'SIGKILL');
  while (isAlive(pid)) await new Promise((r) => setTimeout(r, 50));
  rmSync(node.pidFile, { force: true });
}

/** Waits until every node answers a metadata request (each asked on its own). */
export async function waitClusterReady(nodes: ClusterNode[], log: (line: string) => void): Promise<void> {
  const started = Date.now();
  for (;;) {
    const dead = nodes.filter((n) => existsSync(n.pidFile) && !nodePid(n));
    if (dead.length > 0) {
      throw new Error(
        `Kafka node ${dead.map((n) => n.id).join(', ')} died while starting; see ${dead.map((n) => n.log).join(', ')}`,
      );
    }
    const answers = await Promise.all(nodes.map((n) => kafkaAnswers(n.address, 2000)));
    // Each node answering is not enough: until the controller has registered (unfenced) every
    // broker, creating a topic with replication 3 fails with INVALID_REPLICATION_FACTOR.
    if (answers.every(Boolean) && (await registeredBrokers(nodes)) >= nodes.length) {
      log(`Kafka cluster of ${nodes.length} ready after ${((Date.now() - started) / 1000).toFixed(1)} s`);
      return;
    }
    if (Date.now() - started > READY_DEADLINE_MS) {
      const down = nodes.filter((_, i) => !answers[i]).map((n) => `${n.id} (${n.log})`);
      throw new Error(`Kafka nodes ${down.join(', ')} did not answer within ${READY_DEADLINE_MS / 1000} s`);
    }
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** How many brokers the cluster's metadata lists (0 when no node answers). */
async function registeredBrokers(nodes: ClusterNode[]): Promise<number> {
  const admin = new Kafka({
    clientId: 'cairn-stack-probe',
    brokers: nodes.map((n) => n.address),
    logLevel: logLevel.NOTHING,
    connectionTimeout: 2000,
    requestTimeout: 2000,
    retry: { retries: 0 },
  }).admin();
  try {
    await admin.connect();
    return (await admin.describeCluster()).brokers.length;
  } catch {
    return 0;
  } finally {
    await admin.disconnect().catch(() => {});
  }
}

/** Starts the cluster's nodes that are not running and waits for all of them. */
export async function startLocalCluster(
  size: number,
  log: (line: string) => void,
): Promise<{ started: boolean }> {
  if (size < 1 || size > 9) throw new Error(`--brokers must be 1 to 9, not ${size}`);
  const nodes = clusterNodes(size);
  if (
    nodes.every((n) => nodePid(n)) &&
    (await Promise.all(nodes.map((n) => kafkaAnswers(n.address)))).every(Boolean)
  ) {
    return { started: false };
  }
  ensureDir(kafkaPaths.root);
  fetchJars(log);
  prepare(nodes);
  const started = nodes.filter((n) => !nodePid(n));
  for (const n of started) {
    const pid = startNode(n);
    log(`starting Kafka ${KAFKA_VERSION} node ${n.id} (pid ${pid}) on ${n.address}, log: ${n.log}`);
  }
  try {
    await waitClusterReady(nodes, log);
  } catch (err) {
    // A cluster that did not come up is not left half running: stop the nodes this call started.
    await Promise.all(started.map((n) => killNode(n)));
    throw err;
  }
  return { started: true };
}

/** Stops every node of the local cluster that runs (SIGTERM, then SIGKILL after `graceMs`). */
export async function stopLocalCluster(graceMs = 60_000): Promise<number> {
  const nodes = clusterNodes(9).filter((n) => nodePid(n));
  await Promise.all(
    nodes.map(async (n) => {
      const pid = nodePid(n)!;
      process.kill(pid, 'SIGTERM');
      const deadline = Date.now() + graceMs;
      while (isAlive(pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
      await killNode(n);
    }),
  );
  return nodes.length;
}
