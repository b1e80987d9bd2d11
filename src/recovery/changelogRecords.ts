import type { Operation } from 'fast-json-patch';
import fjp from 'fast-json-patch';
import { sql } from 'kysely';
import type { KeyRing } from '../checkpoints/signing.js';
import type { TenantKeys } from '../crypto/tenantKeys.js';
import type { Db } from '../db/database.js';
import type { Trx } from '../db/executor.js';
import { sqlState } from '../db/sqlstate.js';
import { CairnError, UnavailableError } from '../errors.js';
import {
  type ChangelogBody,
  ChangelogBodySchema,
  type ChangelogEnvelope,
  ChangelogEnvelopeSchema,
  type ChangelogReceipt,
  changelogAad,
  stateDigest,
  verifyEnvelope,
} from '../state/changelog.js';

/**
 * The changelog replay's checks of one record (signature, body, chain, digest) and its writes
 * that are not the task row (receipts), with the database's answers it tells apart from an
 * outage. src/recovery/replayChangelog.ts runs them.
 */

/** What makes a task not rebuilt (reported, held): never an outage. */
export class Unprovable extends CairnError {
  constructor(message: string) {
    super('invariant_violated', message);
  }
}

export function parseEnvelope(value: Buffer | null): ChangelogEnvelope | undefined {
  if (!value) return undefined;
  try {
    const r = ChangelogEnvelopeSchema.safeParse(JSON.parse(value.toString('utf8')));
    return r.success ? (r.data as ChangelogEnvelope) : undefined;
  } catch {
    return undefined;
  }
}

/** Verifies a record's signature and reads its body (decrypted with its tenant's key). */
export async function openRecord(
  db: Db,
  e: ChangelogEnvelope,
  o: { keyRing?: KeyRing | undefined; keys?: TenantKeys | undefined },
): Promise<ChangelogBody> {
  const at = `version ${e.version}`;
  const signed = verifyEnvelope(e, o.keyRing);
  if (!signed.ok) throw new Unprovable(`${at}: ${signed.message}`);
  if (e.omitted)
    throw new Unprovable(`${at} has no body: it was too large to publish (${e.omitted.bytes} bytes)`);
  let raw: unknown = e.body;
  if (e.sealed) {
    // Keys not configured is an outage of configuration, not a bad record.
    if (!o.keys)
      throw new UnavailableError(
        `changelog replay: task ${e.task_id}'s ${at} is encrypted and no tenant keys were given (CAIRN_KEYRING); nothing was concluded`,
      );
    try {
      const plain = await o.keys.open(
        e.tenant_id,
        e.sealed.key_id,
        Buffer.from(e.sealed.ciphertext, 'base64'),
        changelogAad(e),
        db,
      );
      raw = JSON.parse(plain.toString('utf8'));
    } catch (err) {
      // Altered bytes, another tenant's key, a shredded key: this record cannot be read. Anything
      // else (a key provider that does not answer) is an outage, not a bad record: the replay stops.
      if (err instanceof CairnError && ['decryption_failed', 'wrong_tenant_key'].includes(err.code))
        throw new Unprovable(`${at} cannot be read: ${err.message}`);
      // The data key's row gone is shredding (never readable again); a key-encryption key
      // missing from the keyring, or a provider that does not answer, is an outage.
      if (
        err instanceof CairnError &&
        err.code === 'key_missing' &&
        !(await dataKeyExists(db, e.sealed.key_id))
      )
        throw new Unprovable(`${at} cannot be read: its data key ${e.sealed.key_id} was shredded`);
      if (err instanceof UnavailableError) throw err;
      throw new UnavailableError(
        `changelog replay: the key provider did not open the data key of tenant ${e.tenant_id} (${(err as Error).message}); nothing was replayed for task ${e.task_id}, run it again once it answers`,
        err,
      );
    }
  }
  const body = ChangelogBodySchema.safeParse(raw);
  if (!body.success) throw new Unprovable(`${at}: body is not a changelog body`);
  return body.data as ChangelogBody;
}

/** The document after the record, checked against the chain and the record's own digest. */
export function applyRecord(doc: unknown, e: ChangelogEnvelope, body: ChangelogBody): unknown {
  const at = `version ${e.version}`;
  const expectedPrev = doc === null ? null : stateDigest(doc);
  if (body.prev_state_sha256 !== expectedPrev) {
    throw new Unprovable(
      `${at} follows a state (${body.prev_state_sha256}) that is not the one before it here (${expectedPrev})`,
    );
  }
  let next: unknown;
  try {
    next = fjp.applyPatch(
      structuredClone(doc ?? {}),
      body.patch as unknown as Operation[],
      true,
      false,
    ).newDocument;
  } catch (err) {
    throw new Unprovable(`${at}: its patch does not apply (${(err as Error).message})`);
  }
  if (stateDigest(next) !== body.state_sha256)
    throw new Unprovable(`${at}: the patched state's digest differs`);
  const d = next as { task_id?: unknown; tenant_id?: unknown; version?: unknown; status?: unknown };
  if (
    d.task_id !== e.task_id ||
    d.tenant_id !== e.tenant_id ||
    d.version !== e.version ||
    d.status !== body.status
  )
    throw new Unprovable(`${at}: the patched state names another task, tenant, version or status`);
  return next;
}

/** The declared receipt transitions (migration 0008) from `started` to each status a record may name. */
const PATH: Record<string, string[]> = {
  started: ['uncertain'], // its outcome is unknown here: reconcile settles it
  succeeded: ['succeeded'],
  failed: ['failed'],
  uncertain: ['uncertain'],
  compensating: ['uncertain', 'compensating'],
  compensated: ['uncertain', 'compensating', 'compensated'],
  gated: ['uncertain', 'gated'],
};

/** Restores a receipt this database lacks (or one it holds as started that the record saw settled). */
export async function restoreReceipt(trx: Trx, e: ChangelogEnvelope, rc: ChangelogReceipt): Promise<number> {
  const here = await trx
    .selectFrom('tool_receipt')
    .select(['status', 'receipt_id', 'task_id', 'attempt'])
    .where('idempotency_key', '=', rc.idempotency_key)
    .where(sql<boolean>`coalesce(tenant_id, '') = ${e.tenant_id}`)
    .executeTakeFirst();
  // Another attempt (or task) under the same key here is not the one the record saw: left alone.
  if (
    here &&
    (here.receipt_id !== rc.receipt_id || here.task_id !== e.task_id || here.attempt !== rc.attempt)
  )
    return 0;
  let path = PATH[rc.status] ?? ['uncertain'];
  if (here) {
    if (here.status !== 'started' || !['succeeded', 'failed'].includes(rc.status)) return 0;
  } else {
    await sql`
      INSERT INTO tool_receipt (receipt_id, idempotency_key, task_id, tenant_id, step, tool, args_digest, status,
                                attempt, irreversible, worker)
      VALUES (${rc.receipt_id}, ${rc.idempotency_key}, ${e.task_id}, ${e.tenant_id}, ${rc.step}, ${rc.tool},
              ${rc.args_digest}, 'started', ${rc.attempt}, ${rc.irreversible}, ${rc.worker})`.execute(trx);
  }
  if (rc.status === 'started' && here) path = [];
  for (const status of path) {
    const final = status === 'succeeded' || status === 'failed' || status === 'compensated';
    await sql`
      UPDATE tool_receipt SET status = ${status},
             result_digest = ${final ? rc.result_digest : null},
             result = ${final && rc.result != null ? JSON.stringify(rc.result) : null}::jsonb,
             result_enc = ${final && rc.result_enc ? Buffer.from(rc.result_enc, 'base64') : null},
             result_key_id = ${final ? (rc.result_key_id ?? null) : null},
             resolution = 'restored from the changelog after a failover',
             finished_at = ${final ? sql`now()` : sql`finished_at`}
       WHERE idempotency_key = ${rc.idempotency_key} AND coalesce(tenant_id, '') = ${e.tenant_id}`.execute(
      trx,
    );
  }
  return 1;
}

/** Errors of the database that refuse this task's records (a trigger, a constraint): not an outage. */
export function refusedByDatabase(err: unknown): string | undefined {
  if (err instanceof Unprovable) return err.message;
  const state = sqlState(err);
  if (state === 'CN009') return 'quarantined here: release it first';
  // Connection, resources, operator intervention, system errors, serialization: an outage.
  if (!state || /^(08|40|53|54|55|57|58|XX)/.test(state)) return undefined;
  return `the database refused it (${state}): ${(err as Error).message}`;
}

export async function auditedHere(db: Db, taskId: string): Promise<boolean> {
  const r = await db
    .selectFrom('task_audit')
    .select('task_id')
    .where('task_id', '=', taskId)
    .limit(1)
    .execute();
  return r.length > 0;
}

export async function dataKeyExists(db: Db, keyId: string): Promise<boolean> {
  const r = await db.selectFrom('tenant_key').select('key_id').where('key_id', '=', keyId).execute();
  return r.length > 0;
}

export async function deletedByRetention(db: Db, tenantId: string, taskId: string): Promise<boolean> {
  const r = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM deletion_certificate
     WHERE tenant_id = ${tenantId}
       AND body->'tasks' @> jsonb_build_array(jsonb_build_object('task_id', ${taskId}::text))`.execute(db);
  return r.rows[0]!.n > 0;
}
