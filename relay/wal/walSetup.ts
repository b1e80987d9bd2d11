import { sql } from 'kysely';
import type { Db } from '../../src/db/database.js';
import { databaseAddress } from '../../src/db/database.js';
import { ConfigurationError, ValidationError } from '../../src/errors.js';
import type { Logger } from '../../src/logger.js';

/** The publication and slot the WAL mode uses unless told otherwise. */
export const DEFAULT_PUBLICATION = 'cairn_outbox';
export const DEFAULT_SLOT = 'cairn_relay';

const NAME = /^[a-z0-9_]{1,63}$/;

/** Slot and publication names go into replication commands as identifiers: lower-case letters, digits, `_`. */
export function checkName(field: string, value: string): string {
  if (!NAME.test(value)) {
    throw new ValidationError('relay options', [
      { path: field, message: 'use 1 to 63 lower-case letters, digits or underscores', value },
    ]);
  }
  return value;
}

const privilegeDenied = (err: unknown) => (err as { code?: string }).code === '42501';

/**
 * What the WAL mode needs from the server, checked before anything streams: wal_level
 * logical, a publication of the outbox's inserts, and the slot. The publication and the slot
 * are created when missing (it needs the outbox's owner, and the REPLICATION attribute or a
 * superuser); a role without those rights gets a ConfigurationError with the statement to run.
 * Returns the schema the outbox is in (the stream takes only that table's inserts).
 */
export async function prepareWal(db: Db, o: { slot: string; publication: string }): Promise<string> {
  const where = databaseAddress(db);
  const { rows } = await sql<{ wal_level: string; schema: string; server: number }>`
    SELECT current_setting('wal_level') AS wal_level,
           (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.oid = 'outbox'::regclass) AS schema,
           current_setting('server_version_num')::int AS server`.execute(db);
  const { wal_level, schema, server } = rows[0]!;
  if (wal_level !== 'logical') {
    throw new ConfigurationError(
      `${where}: wal_level is ${wal_level}; the relay's WAL mode needs wal_level = logical ` +
        '(ALTER SYSTEM SET wal_level = logical, then restart Postgres), or run the relay in its polling mode',
    );
  }
  if (server < 140000) {
    throw new ConfigurationError(
      `${where}: Postgres ${server}; the relay's WAL mode needs Postgres 14 or later (pgoutput's binary option)`,
    );
  }
  const createPublication = `CREATE PUBLICATION ${o.publication} FOR TABLE ${schema}.outbox WITH (publish = 'insert')`;
  const pub = await sql<{ pubinsert: boolean; has_outbox: boolean }>`
    SELECT p.pubinsert,
           EXISTS (SELECT 1 FROM pg_publication_tables t
                    WHERE t.pubname = p.pubname AND t.schemaname = ${schema} AND t.tablename = 'outbox') AS has_outbox
      FROM pg_publication p WHERE p.pubname = ${o.publication}`.execute(db);
  if (pub.rows.length === 0) {
    await sql
      .raw(createPublication)
      .execute(db)
      .catch((err: unknown) => {
        // Two relays starting at once: the other one created it (42710, or 23505 on the catalog).
        const code = (err as { code?: string }).code;
        if (code === '42710' || code === '23505') return;
        return refused(where, createPublication)(err);
      });
  } else if (!pub.rows[0]!.pubinsert || !pub.rows[0]!.has_outbox) {
    throw new ConfigurationError(
      `${where}: publication ${o.publication} exists but does not publish the inserts of ${schema}.outbox; ` +
        `drop it or name another one (${createPublication})`,
    );
  }
  const createSlot = `SELECT pg_create_logical_replication_slot('${o.slot}', 'pgoutput')`;
  const slot = await sql<{ plugin: string; database: string; here: string }>`
    SELECT plugin, database, current_database() AS here FROM pg_replication_slots WHERE slot_name = ${o.slot}`.execute(
    db,
  );
  if (slot.rows.length === 0) {
    await sql
      .raw(createSlot)
      .execute(db)
      .catch((err: unknown) => {
        // Two relays starting at once: the other one created it.
        if ((err as { code?: string }).code === '42710') return;
        return refused(where, createSlot)(err);
      });
  } else {
    const s = slot.rows[0]!;
    if (s.plugin !== 'pgoutput' || s.database !== s.here) {
      throw new ConfigurationError(
        `${where}: replication slot ${o.slot} exists for plugin ${s.plugin} on database ${s.database}; ` +
          'the relay needs a pgoutput slot on this database: name another slot',
      );
    }
  }
  return schema;
}

function refused(where: string, statement: string) {
  return (err: unknown): never => {
    if (privilegeDenied(err)) {
      throw new ConfigurationError(
        `${where}: ${(err as Error).message}; run as a role allowed to (the outbox's owner, with REPLICATION): ${statement}`,
        err,
      );
    }
    throw err;
  };
}

/** How far the slot is behind the server's WAL (bytes it holds on disk), and whether a relay streams it; undefined without the slot. */
export async function slotLag(
  db: Db,
  slot: string,
): Promise<{ lagBytes: number; active: boolean } | undefined> {
  const { rows } = await sql<{ lag: string | null; active: boolean }>`
    SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::text AS lag, active
      FROM pg_replication_slots WHERE slot_name = ${slot}`.execute(db);
  const r = rows[0];
  return r ? { lagBytes: Number(r.lag ?? 0), active: r.active } : undefined;
}

/**
 * Reads the secret the outbox's trigger writes into each WAL message (migration 0019: known to
 * the outbox's owner alone, so no role that may call `pg_logical_emit_message` forges a
 * message), and registers the slot as their reader with the server's timeline: writing a
 * message needs a registered reader, so none is written for want of a slot. A relay whose
 * role cannot read the secret reads no messages: its slot is not registered (writers are
 * refused instead of writing what it could not check), and the warning says why.
 */
export async function registerMessageReader(db: Db, slot: string, log: Logger): Promise<Buffer | undefined> {
  let secret: Buffer | undefined;
  try {
    const { rows } = await sql<{ secret: string }>`SELECT secret FROM outbox_wal_secret`.execute(db);
    secret = rows[0] ? Buffer.from(rows[0].secret, 'hex') : undefined;
    if (secret?.length !== 32) secret = undefined; // (migration 0019 makes one of 32 bytes, and keeps it)
  } catch (err) {
    if (!privilegeDenied(err)) throw err;
  }
  if (secret === undefined) {
    await forgetMessageReader(db, slot).catch(() => {});
    log.warn(
      { slot },
      "outbox messages to the WAL are off: this relay's role cannot read outbox_wal_secret (run it as the outbox's owner)",
    );
    return undefined;
  }
  await sql`
    INSERT INTO outbox_wal_reader (slot_name, timeline)
    VALUES (${slot}, substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))
    ON CONFLICT (slot_name) DO UPDATE SET timeline = EXCLUDED.timeline, registered_at = now()
      WHERE outbox_wal_reader.timeline IS DISTINCT FROM EXCLUDED.timeline`.execute(db);
  return secret;
}

/**
 * Writing WAL messages is refused from now on (until a relay registers again): the timeline no
 * server has. The row stays: its moved_lsn still says what a slot may deliver again.
 */
export async function forgetMessageReader(db: Db, slot: string): Promise<void> {
  await sql`UPDATE outbox_wal_reader SET timeline = '' WHERE slot_name = ${slot}`.execute(db);
}

/**
 * Whether WAL messages may have been lost: the slot was registered as a reader and is gone, or
 * can no longer be streamed (a promotion on Postgres 15/16, where slots stay on the old primary;
 * an invalidation by max_slot_wal_keep_size; a drop by hand). What it held, messages committed
 * and not acknowledged, cannot be read by any new slot.
 */
export async function registeredSlotLost(
  db: Db,
  slot: string,
  o: { dropping?: boolean } = {},
): Promise<boolean> {
  const { rows } = await sql<{ usable: boolean }>`
    SELECT EXISTS (SELECT 1 FROM pg_replication_slots s
                    WHERE s.slot_name = w.slot_name AND s.database = current_database()
                      AND s.wal_status IS DISTINCT FROM 'lost') AS usable
      FROM outbox_wal_reader w WHERE w.slot_name = ${slot} AND w.timeline <> ''`.execute(db);
  return rows.length > 0 && (o.dropping === true || !rows[0]!.usable);
}
