import type { TenantKeys } from '../crypto/tenantKeys.js';
import type { Db } from '../db/database.js';
import { CairnError } from '../errors.js';
import type { ReceiptRow } from './types.js';

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
export function createResultCodec(db: Db, keys: TenantKeys | undefined) {
  return {
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
  };
}
