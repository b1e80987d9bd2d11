import { hasDataKey, type TenantKeys } from '../crypto/tenantKeys.js';
import type { Db } from '../db/database.js';
import { CairnError, messageOf, UnavailableError } from '../errors.js';
import type { Logger } from '../logger.js';
import type { ReceiptRow } from './types.js';

/** A success stored without its result, its digest only (digestOnly, or a key that will not seal it). */
export const NO_RESULT = { result: null, result_enc: null, result_key_id: null };

/** A receipt row as stored: the result in the clear, or encrypted with the key id beside it. */
export type StoredRow = ReceiptRow & {
  result_enc: Buffer | null;
  result_key_id: string | null;
  tenant_id: string | null;
};

/**
 * How a receipt's result is stored: JSON in the clear without tenant keys; with them,
 * AES-256-GCM under the tenant's data key (AAD `receipt:<id>`), the key id beside it.
 */
export function createResultCodec(db: Db, keys: TenantKeys | undefined, log: Logger) {
  const codec = {
    async decode(row: StoredRow): Promise<ReceiptRow> {
      const { result_enc, result_key_id, tenant_id, ...rest } = row;
      if (!result_key_id || !result_enc) return rest;
      if (!keys) {
        throw new CairnError(
          'key_missing',
          `receipt ${row.receipt_id}: its result is encrypted (key ${result_key_id}) and this receipt store has no tenant keys`,
        );
      }
      const plain = await keys.open(tenant_id ?? '', result_key_id, result_enc, `receipt:${row.receipt_id}`);
      return { ...rest, result: JSON.parse(plain.toString('utf8')) };
    },

    async encode(receiptId: string, result: unknown) {
      const json = JSON.stringify(result ?? null);
      if (!keys) return { result: json, result_enc: null, result_key_id: null };
      const row = await db
        .selectFrom('tool_receipt')
        .select('tenant_id')
        .where('receipt_id', '=', receiptId)
        .executeTakeFirstOrThrow();
      const sealed = await keys.seal(row.tenant_id ?? '', Buffer.from(json), `receipt:${receiptId}`);
      return { result: null, result_enc: sealed.bytes, result_key_id: sealed.keyId };
    },

    /**
     * The result as a success stores it. Whatever keeps the tenant's key from sealing it now (a
     * provider that did not answer or refused, a key-encryption key this process's keyring
     * lacks) is an outage: thrown as one, and the success is recorded once it passes
     * (recordThroughOutages sends it again, and logs each try). Only a tenant with no data key
     * at all (never given one, or shredded) can never have it sealed: the success is stored
     * without its result, its digest kept. A known success is never left `started` for
     * reconcile to take for uncertain and gate, compensate or run again.
     */
    async encodeSuccess(receiptId: string, result: unknown) {
      try {
        return await codec.encode(receiptId, result);
      } catch (err) {
        if (!(err instanceof CairnError)) throw err; // Postgres: recordThroughOutages decides
        const tenant = await db
          .selectFrom('tool_receipt')
          .select('tenant_id')
          .where('receipt_id', '=', receiptId)
          .executeTakeFirst();
        if (tenant && (await hasDataKey(db, tenant.tenant_id ?? ''))) {
          throw new UnavailableError(`sealing the result of receipt ${receiptId}: ${messageOf(err)}`, err);
        }
        log.error(
          { receipt_id: receiptId, err: messageOf(err) },
          "the effect's success is recorded without its result: its tenant has no data key to seal it",
        );
        return NO_RESULT;
      }
    },
  };
  return codec;
}
