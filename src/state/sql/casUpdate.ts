import { CompiledQuery } from 'kysely';
import type { Executor } from '../../db/executor.js';
import { PREPARED } from '../../db/pool.js';
import { SqlState } from '../../db/sqlstate.js';
import { coalescedCas } from './casBatch.js';

export interface CasRow {
  taskId: string;
  /** The task's tenant: concurrent CAS requests are coalesced per tenant (casBatch.ts). */
  tenantId: string;
  expectedVersion: number;
  /** updated_at of the document the change was computed from: guards a cached copy. */
  expectedUpdatedAt: string;
  status: string;
  schemaVersion: string;
  doc: unknown;
  audit: { actor: string; reason: string | null; patch: unknown[] };
}

/**
 * The compare-and-swap and its audit row, in ONE statement (so it is atomic even outside a
 * transaction, and costs one round trip). `WHERE version = $expected` decides the race:
 * under READ COMMITTED a second writer that named the same version blocks on the row lock,
 * re-checks the WHERE against the committed row, finds the new version and updates 0 rows,
 * so nothing is written and no audit row appears. The row trigger (migration 0001) checks
 * version + 1, terminal states and the transition table again in SQL.
 *
 * Measured on the 2-core dev machine, 8 workers (bench/cas.ts): ~2,500-2,800 CAS/s against
 * ~5,400-5,700 raw `SET version = version + 1`/s (ratio 0.45-0.52). pgbench with the same
 * two statements and no Node at all gives 3,700 vs 6,400 tps (0.58): the audit row's heap
 * and index insert is most of the gap, and it is not optional.
 *
 * It returns no row: the INSERT's row count (1, or 0 when the CAS matched nothing) says
 * whether it swapped. A RETURNING row cost Node a row description and a data row to parse
 * per update: 135.9 -> 98.1 µs of Node CPU per update without it (bench/cas.ts's statements,
 * 8 workers, 3 alternating rounds in one run on the 2-core machine).
 *
 * It runs as a named prepared statement (PREPARED, unless the Db was made with
 * `preparedStatements: false`): parsed, rewritten and planned once per connection. Same
 * workers, same run: Postgres CPU 517 -> 384 µs per update, Node 137 -> 116, 1,366 -> 1,741
 * updates/s.
 */
export function casUpdate(db: Executor, row: CasRow, opts: { coalesce: boolean }): Promise<boolean> {
  return opts.coalesce && !db.isTransaction ? coalescedCas(db, row, casAlone) : casAlone(db, row);
}

/** The CAS in a statement of its own. */
async function casAlone(db: Executor, row: CasRow): Promise<boolean> {
  try {
    return await runCas(db, row);
  } catch (error) {
    // The connection had lost the prepared statement (DEALLOCATE ALL on it); the pool forgot
    // it, so the next run parses it again. Outside a transaction nothing was written and
    // nothing else is lost: run it once more. Inside one the transaction is aborted already.
    if ((error as { code?: unknown }).code !== SqlState.invalidSqlStatementName || db.isTransaction)
      throw error;
    return await runCas(db, row);
  }
}

async function runCas(db: Executor, row: CasRow): Promise<boolean> {
  const result = await db.executeQuery(
    CompiledQuery.raw(CAS_SQL, [
      row.status,
      row.schemaVersion,
      JSON.stringify(row.doc),
      row.taskId,
      row.expectedVersion,
      row.expectedUpdatedAt,
      row.audit.actor,
      row.audit.reason,
      JSON.stringify(row.audit.patch),
    ]),
  );
  return result.numAffectedRows === 1n;
}

/**
 * The statement as Postgres receives it, written out once rather than built with the `sql`
 * tag and compiled by kysely on every call. Values are still only parameters, in the order
 * casUpdate passes them. Same run, alternating rounds, 8 workers on the 2-core machine (busy
 * with other work): Node CPU 263 -> 226 µs per update (Postgres 586 -> 571); with the network
 * cut out (pg answering at once) 26 -> 21 µs.
 */
const CAS_SQL = `${PREPARED}
    WITH swapped AS (
      UPDATE task_state
         SET version = version + 1,
             status = $1,
             schema_version = $2,
             doc = $3::jsonb,
             updated_at = now()
       WHERE task_id = $4
         AND version = $5
         AND doc->>'updated_at' = $6
      RETURNING task_id, tenant_id, version
    )
    INSERT INTO task_audit (task_id, version, prev_version, tenant_id, actor, reason, patch)
    SELECT task_id, version, version - 1, tenant_id, $7, $8, $9::jsonb
      FROM swapped`;
