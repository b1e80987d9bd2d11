import { execFile } from 'node:child_process';
import {
  appendFileSync,
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  writeFileSync,
} from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { defaultSchema, searchPathOption } from '../../src/db/pool.js';

const exec = promisify(execFile);

/**
 * A throw-away PostgreSQL server from Debian's binaries, in a folder of its own, on its own
 * port and socket folder: a "region" for the failover harness. It never touches the
 * machine's own cluster. As root, the server runs as the `postgres` user (Postgres refuses
 * to run as root); otherwise as whoever runs this.
 */
export interface PgServer {
  name: string;
  dir: string;
  port: number;
  url(database?: string): string;
  /** `pg_ctl stop -m immediate`: the server dies without a checkpoint, as in a crash. */
  crash(): Promise<void>;
  stop(): Promise<void>;
  promote(): Promise<void>;
  query<T extends pg.QueryResultRow = pg.QueryResultRow>(text: string, database?: string): Promise<T[]>;
  logTail(): Promise<string>;
}

export function findPgBin(): string {
  const fromEnv = process.env.CAIRN_PG_BIN;
  if (fromEnv) return fromEnv;
  const root = '/usr/lib/postgresql';
  const versions = existsSync(root)
    ? readdirSync(root)
        .filter((v) => existsSync(join(root, v, 'bin', 'pg_ctl')))
        .sort((a, b) => Number(b) - Number(a))
    : [];
  if (versions.length === 0) {
    throw new Error(
      `no PostgreSQL server binaries under ${root} (looked for */bin/pg_ctl); install postgresql or set CAIRN_PG_BIN to the folder holding pg_ctl`,
    );
  }
  return join(root, versions[0]!, 'bin');
}

const asRoot = process.getuid?.() === 0;
const pgUser = asRoot ? 'postgres' : (process.env.USER ?? 'postgres');

async function run(bin: string, args: string[]): Promise<string> {
  const [cmd, argv] = asRoot ? ['runuser', ['-u', 'postgres', '--', bin, ...args]] : [bin, args];
  try {
    const { stdout } = await exec(cmd, argv, { timeout: 120_000 });
    return stdout;
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(`${bin.split('/').pop()} ${args.join(' ')} failed: ${e.stderr?.trim() || e.message}`);
  }
}

export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as { port: number };
  await new Promise((r) => server.close(r));
  return port;
}

/** A folder the server's user owns (the harness's temp root is created by whoever runs it). */
function ownedDir(path: string): string {
  mkdirSync(path, { recursive: true });
  chmodSync(path, 0o700);
  if (asRoot) {
    const { uid, gid } = userIds('postgres');
    chownSync(path, uid, gid);
  }
  return path;
}

let ids: { uid: number; gid: number } | undefined;
function userIds(user: string): { uid: number; gid: number } {
  if (!ids) {
    const line = readFileSync('/etc/passwd', 'utf8')
      .split('\n')
      .find((l) => l.startsWith(`${user}:`));
    if (!line)
      throw new Error(`user ${user} does not exist; the failover harness runs Postgres as it when root`);
    const [, , uid, gid] = line.split(':');
    ids = { uid: Number(uid), gid: Number(gid) };
  }
  return ids;
}

function server(name: string, bin: string, dir: string, port: number): PgServer {
  const log = join(dir, '..', `${name}.log`);
  const url = (database = 'postgres') => `postgres://${pgUser}@127.0.0.1:${port}/${database}`;
  return {
    name,
    dir,
    port,
    url,
    crash: () => run(join(bin, 'pg_ctl'), ['-D', dir, 'stop', '-m', 'immediate', '-w']).then(() => {}),
    stop: () =>
      run(join(bin, 'pg_ctl'), ['-D', dir, 'stop', '-m', 'fast', '-w'])
        .then(() => {})
        .catch(() => {}),
    promote: () => run(join(bin, 'pg_ctl'), ['-D', dir, 'promote', '-w']).then(() => {}),
    async query<T extends pg.QueryResultRow>(text: string, database?: string) {
      // Cairn's schema first, as on Cairn's own connections: the evidence reads its tables.
      const c = new pg.Client({
        connectionString: url(database),
        connectionTimeoutMillis: 5000,
        options: searchPathOption(defaultSchema()),
      });
      await c.connect();
      try {
        return (await c.query<T>(text)).rows;
      } finally {
        await c.end();
      }
    },
    logTail: async () => {
      try {
        return readFileSync(log, 'utf8').split('\n').slice(-30).join('\n');
      } catch {
        return '(no log)';
      }
    },
  };
}

async function start(bin: string, name: string, dir: string, port: number, socketDir: string): Promise<void> {
  const log = join(dir, '..', `${name}.log`);
  writeFileSync(log, '');
  if (asRoot) {
    const { uid, gid } = userIds('postgres');
    chownSync(log, uid, gid);
  }
  await run(join(bin, 'pg_ctl'), [
    '-D',
    dir,
    '-l',
    log,
    '-o',
    `-p ${port} -k ${socketDir} -c listen_addresses=127.0.0.1`,
    'start',
    '-w',
    '-t',
    '60',
  ]);
  started.add(dir);
}

// Servers never outlive the process that started them, even when it dies of an error.
const started = new Set<string>();
process.once('exit', () => {
  for (const dir of started) {
    const pidFile = join(dir, 'postmaster.pid');
    if (!existsSync(pidFile)) continue;
    const pid = Number(readFileSync(pidFile, 'utf8').split('\n')[0]);
    try {
      process.kill(pid, 'SIGQUIT'); // Postgres' immediate shutdown
    } catch {}
  }
});

/**
 * initdb + a primary that accepts replication from 127.0.0.1; asynchronous until
 * `requireSynchronous` names a standby (set it once the standby streams, or every commit waits).
 * `walLevel: 'logical'` for the relay's WAL mode (logical decoding).
 */
export async function startPrimary(
  root: string,
  name: string,
  o: { walLevel?: 'replica' | 'logical' } = {},
): Promise<PgServer> {
  const bin = findPgBin();
  ownedDir(root);
  const dir = ownedDir(join(root, name));
  const socketDir = ownedDir(join(root, 'sockets'));
  await run(join(bin, 'initdb'), ['-D', dir, '-U', pgUser, '--auth=trust', '--no-sync', '-E', 'UTF8']);
  const conf = [
    `wal_level = ${o.walLevel ?? 'replica'}`,
    'max_wal_senders = 8',
    'max_replication_slots = 8',
    'wal_keep_size = 256MB',
    'max_connections = 200',
    'shared_buffers = 64MB',
    'synchronous_commit = on',
    'hot_standby = on',
    'wal_receiver_status_interval = 1s',
    'fsync = on',
  ];
  writeFileSync(join(dir, 'postgresql.auto.conf'), `${conf.join('\n')}\n`);
  writeFileSync(
    join(dir, 'pg_hba.conf'),
    'local all all trust\nhost all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n',
  );
  const port = await freePort();
  await start(bin, name, dir, port, socketDir);
  return server(name, bin, dir, port);
}

/** pg_basebackup of `primary` + a streaming standby named `name` (its application_name). */
export async function startStandby(root: string, name: string, primary: PgServer): Promise<PgServer> {
  const bin = findPgBin();
  const dir = join(root, name);
  const socketDir = join(root, 'sockets');
  await run(join(bin, 'pg_basebackup'), [
    '-h',
    '127.0.0.1',
    '-p',
    String(primary.port),
    '-U',
    pgUser,
    '-D',
    dir,
    '-X',
    'stream',
    '-c',
    'fast',
    '--no-sync',
  ]);
  chmodSync(dir, 0o700);
  writeFileSync(join(dir, 'standby.signal'), '');
  appendFileSync(
    join(dir, 'postgresql.auto.conf'),
    `primary_conninfo = 'host=127.0.0.1 port=${primary.port} user=${pgUser} application_name=${name}'\n` +
      "synchronous_standby_names = ''\n",
  );
  if (asRoot) await exec('chown', ['-R', 'postgres:postgres', dir]);
  const port = await freePort();
  await start(bin, name, dir, port, socketDir);
  return server(name, bin, dir, port);
}

/** Makes every commit on `primary` wait until `standby` has flushed it (synchronous replication). */
export async function requireSynchronous(primary: PgServer, standby: string): Promise<void> {
  await primary.query(`ALTER SYSTEM SET synchronous_standby_names = '${standby}'`);
  await primary.query('SELECT pg_reload_conf()');
}

/**
 * Cuts the standby off its primary (a network partition): it stops receiving WAL while the
 * primary, if asynchronous, goes on committing.
 */
export async function partition(standby: PgServer): Promise<void> {
  await standby.query("ALTER SYSTEM SET primary_conninfo = ''");
  await standby.query('SELECT pg_reload_conf()');
}

/** Starts an existing data folder again on a new port (after a crash: with crash recovery). */
export async function restart(root: string, name: string): Promise<PgServer> {
  const bin = findPgBin();
  const dir = join(root, name);
  const port = await freePort();
  await start(bin, name, dir, port, join(root, 'sockets'));
  return server(name, bin, dir, port);
}
