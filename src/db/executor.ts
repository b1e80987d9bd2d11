import type { Kysely, Transaction } from 'kysely';
import type { Database } from './types.js';

/** Anything a query can run on: the pool or the caller's transaction. */
export type Executor = Kysely<Database> | Transaction<Database>;
/** A transaction on Cairn's tables: what writes that join the caller's transaction accept. */
export type Trx = Transaction<Database>;

/** Runs `fn` in the caller's transaction when given one, else in a new transaction. */
export function inTransaction<T>(
  db: Kysely<Database>,
  trx: Trx | undefined,
  fn: (t: Trx) => Promise<T>,
): Promise<T> {
  return trx ? fn(trx) : db.transaction().execute(fn);
}
