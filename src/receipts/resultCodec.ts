import type { TenantKeys } from '../crypto/tenantKeys.js';
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
     * The result as a success stores it. A key provider that did not answer throws, and the
     * success is recorded once it answers (recordThroughOutages sends it again). A key that
     * can never seal it (the provider refused, the tenant's key shredded) stores the success
     * without its result, its digest kept: a known success is never left `started` for
     * reconcile to take for uncertain and gate, compensate or run again.
     */
    async encodeSuccess(receiptId: string, result: unknown) {
      try {
        return await codec.encode(receiptId, result);
      } catch (err) {
        if (!(err instanceof CairnError) || (err instanceof UnavailableError && !err.refused)) throw err;
        log.error(
          { receipt_id: receiptId, err: messageOf(err) },
          "the effect's success is recorded without its result: its tenant's key cannot seal it",
        );
        return NO_RESULT;
      }
    },
  };
  return codec;
}
