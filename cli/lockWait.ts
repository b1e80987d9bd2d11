import { sql } from 'kysely';
import type { Db } from '../src/db/database.js';
import { line } from './output.js';

/**
 * The advisory locks Cairn's commands wait on. Any role can take any advisory lock, a tenant's
 * login role too: `cairn migrate` (kysely's migration lock, which it waits an hour for) and
 * `cairn tenant add` (cairn_register_tenant's) waited on one silently.
 */
export const COMMAND_LOCKS = {
  migration: sql<bigint>`3853314791062309107::bigint`,
  'tenant registration': sql<bigint>`hashtext('cairn_register_tenant')::bigint`,
} as const;

export interface LockHolder {
  lock: string;
  pid: number;
  role: string | null;
  application: string | null;
  state: string | null;
  since: Date | null;
}

/** Sessions holding one of `locks` while another session waits for it. */
export async function lockHolders(db: Db, locks: Partial<typeof COMMAND_LOCKS>): Promise<LockHolder[]> {
  const out: LockHolder[] = [];
  for (const [name, key] of Object.entries(locks)) {
    const { rows } = await sql<Omit<LockHolder, 'lock'>>`
      WITH k AS (SELECT ${key} AS key),
           held AS (
             SELECT l.pid, l.granted FROM pg_locks l, k
              WHERE l.locktype = 'advisory' AND l.objsubid = 1
                AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND l.classid = ((k.key >> 32) & 4294967295)::oid AND l.objid = (k.key & 4294967295)::oid)
      SELECT h.pid, a.usename AS role, a.application_name AS application, a.state,
             coalesce(a.xact_start, a.backend_start) AS since
        FROM held h LEFT JOIN pg_stat_activity a ON a.pid = h.pid
       WHERE h.granted AND EXISTS (SELECT 1 FROM held w WHERE NOT w.granted)`.execute(db);
    for (const r of rows) out.push({ lock: name, ...r });
  }
  return out;
}

/**
 * Runs `work`; while it has not finished after `firstMs`, and every `everyMs` after, says on
 * stderr who holds the locks it may wait on (a tenant's session holding one blocks it).
 */
export async function sayingWhoHolds<T>(
  db: Db,
  locks: Partial<typeof COMMAND_LOCKS>,
  work: () => Promise<T>,
  o: { firstMs?: number; everyMs?: number; say?: (text: string) => void; json?: boolean } = {},
): Promise<T> {
  // With --json stderr is one JSON object at most (an error a script parses whole): quiet.
  if (o.json) return work();
  const say = o.say ?? ((text: string) => console.error(text));
  let done = false;
  // Unreferenced: a command that finished does not wait for the next look.
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms).unref());
  const watch = async () => {
    await sleep(o.firstMs ?? 3000);
    while (!done) {
      const holders = await lockHolders(db, locks).catch(() => []);
      for (const h of holders) {
        if (done) return;
        say(
          line`waiting for the ${h.lock} lock, held by backend ${h.pid} (role ${h.role ?? '?'}, application ${JSON.stringify(h.application ?? '')}, ${h.state ?? 'state not visible'} since ${h.since?.toISOString() ?? '?'}); ` +
            'it goes on once that session ends or lets go (pg_terminate_backend(pid) ends it)',
        );
      }
      await sleep(o.everyMs ?? 10_000);
    }
  };
  const watching = watch();
  try {
    return await work();
  } finally {
    done = true;
    void watching;
  }
}
