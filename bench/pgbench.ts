/**
 * pgbench running the statements a TaskStore update sends, with no Node in the loop: the
 * ceiling the CAS bench compares Cairn with (issue 16: CAS >= 0.9 x pgbench).
 *
 * The statements are captured, not copied: one update is run through a store while pg's
 * Client.query is watched, so the script follows whatever the store sends on the wire (its
 * text, its parameters, BEGIN/COMMIT if it opens a transaction). The parameters are replayed
 * as pgbench variables in extended protocol (`-M extended`: unnamed statements, parse and
 * bind on every execution, as node-postgres sends them; `-M prepared` when the store sends
 * named statements). What differs per execution is the expected version, which the script
 * raises by one after the statement that names it (a client-side \set, no round trip); the
 * CAS bench checks afterwards that each task's version rose by exactly the transactions
 * pgbench counted, so a CAS that matched nothing cannot pass unseen. The document's
 * updated_at is frozen by a fixed clock, so the store's `doc->>'updated_at'` guard holds on
 * every repetition with the same document.
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';

/** One statement as the client sent it (with its prepared statement's name, if any). */
export interface SentStatement {
  text: string;
  values: unknown[];
  name?: string;
}

/** pgbench's binary: CAIRN_PGBENCH, Debian's Postgres 15 install, else `pgbench` on PATH; null if none runs. */
export function findPgbench(): string | null {
  const candidates = [process.env.CAIRN_PGBENCH, '/usr/lib/postgresql/15/bin/pgbench', 'pgbench'].filter(
    (c): c is string => !!c,
  );
  for (const c of candidates) {
    if (c.includes('/') && !existsSync(c)) continue;
    if (spawnSync(c, ['--version']).status === 0) return c;
  }
  return null;
}

/** Runs `fn` and returns every statement pg sent meanwhile (on any client of this process). */
export async function captureStatements(fn: () => Promise<void>): Promise<SentStatement[]> {
  const sent: SentStatement[] = [];
  const proto = pg.Client.prototype as unknown as { query: (...a: unknown[]) => unknown };
  const original = proto.query;
  proto.query = function (this: unknown, ...args: unknown[]) {
    const [first, second] = args;
    const text = typeof first === 'string' ? first : (first as { text: string }).text;
    const config = typeof first === 'object' && first !== null ? (first as SentStatement) : undefined;
    const values = config?.values ?? (Array.isArray(second) ? second : []);
    sent.push({ text, values: [...values], ...(config?.name ? { name: config.name } : {}) });
    return original.apply(this, args);
  };
  try {
    await fn();
  } finally {
    proto.query = original;
  }
  return sent;
}

/**
 * A pgbench script of the captured statements and the variables of one client. `perClient`
 * maps a captured value (the capture task's id) to this client's; the captured expected
 * version becomes `:version`, raised by one after its statement. `mode` is pgbench's -M:
 * `prepared` when the store sent named (prepared) statements, `extended` otherwise.
 */
export function pgbenchScript(
  sent: readonly SentStatement[],
  expectedVersion: number,
): {
  script: string;
  mode: 'prepared' | 'extended';
  values: (perClient: (v: string) => string) => string[];
} {
  const vars: { name: string; value: string }[] = [];
  let versionUses = 0;
  const lines = sent.map((s, i) => {
    const before = versionUses;
    const text = s.text.replace(/\$(\d+)\b/g, (_, n: string) => {
      const v = s.values[Number(n) - 1];
      if (v === null || v === undefined) return 'NULL'; // pgbench has no NULL variable
      if (v === expectedVersion) {
        versionUses++;
        return ':version';
      }
      const name = `s${i}p${n}`;
      vars.push({ name, value: typeof v === 'string' ? v : JSON.stringify(v) });
      return `:${name}`;
    });
    const statement = `${text.trim().replace(/;$/, '')};`;
    return versionUses > before ? `${statement}\n\\set version :version + 1` : statement;
  });
  if (versionUses !== 1) {
    throw new Error(
      `cannot turn the captured update into a pgbench script: expected version ${expectedVersion} is ` +
        `a parameter ${versionUses} times (want 1)`,
    );
  }
  const named = sent.filter((s) => s.name).length;
  if (named !== 0 && named !== sent.length) {
    throw new Error(`the update sent ${named} of ${sent.length} statements prepared: pgbench has one -M`);
  }
  return {
    script: `${lines.join('\n')}\n`,
    mode: named ? 'prepared' : 'extended',
    values: (perClient) => vars.flatMap((v) => ['-D', `${v.name}=${perClient(v.value)}`]),
  };
}

/** What pgbench did: transactions per second summed over its clients, and the transactions of each. */
export interface PgbenchResult {
  tps: number;
  transactions: number;
  perClient: number[];
}

/**
 * Runs one pgbench process per client (each needs variables of its own: its task's id and
 * document), all at once for `seconds`, and sums their rates. Their backends carry
 * application_name `cairn-bench-pgbench`.
 */
export async function runPgbench(o: {
  bin: string;
  url: string;
  searchPath: string;
  script: string;
  mode: 'prepared' | 'extended';
  seconds: number;
  clients: Array<{ args: string[]; version: number }>;
}): Promise<PgbenchResult> {
  const dir = await mkdtemp(join(tmpdir(), 'cairn-pgbench-'));
  try {
    const file = join(dir, 'cas.sql');
    await writeFile(file, o.script);
    const env = {
      ...process.env,
      PGOPTIONS: `-c search_path=${o.searchPath}`,
      PGAPPNAME: 'cairn-bench-pgbench',
    };
    const runs = o.clients.map(
      (c) =>
        new Promise<{ tps: number; transactions: number }>((resolve, reject) => {
          const args = ['-n', '-M', o.mode, '-c', '1', '-j', '1', '-T', String(o.seconds), '-f', file];
          const p = spawn(o.bin, [...args, '-D', `version=${c.version}`, ...c.args, o.url], { env });
          let out = '';
          p.stdout.on('data', (d) => {
            out += d;
          });
          p.stderr.on('data', (d) => {
            out += d;
          });
          p.on('error', reject);
          p.on('close', (code) => {
            const tps = /tps = ([\d.]+) \(without initial connection time\)/.exec(out);
            const done = /number of transactions actually processed: (\d+)/.exec(out);
            if (code !== 0 || !tps || !done) reject(new Error(`pgbench exited ${code}:\n${out}`));
            else resolve({ tps: Number(tps[1]), transactions: Number(done[1]) });
          });
        }),
    );
    const results = await Promise.all(runs);
    return {
      tps: results.reduce((s, r) => s + r.tps, 0),
      transactions: results.reduce((s, r) => s + r.transactions, 0),
      perClient: results.map((r) => r.transactions),
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** CPU seconds of this process's children that ended and were reaped (/proc/self/stat cutime + cstime). */
export async function reapedChildrenCpuS(): Promise<number> {
  const stat = await readFile('/proc/self/stat', 'utf8');
  const f = stat
    .slice(stat.lastIndexOf(')') + 1)
    .trim()
    .split(/\s+/);
  return (Number(f[13]) + Number(f[14])) / 100;
}
