import { randomBytes, randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import { z } from 'zod';
import type { Db } from '../db/database.js';
import type { Executor } from '../db/executor.js';
import { assertTenantId, assertTenantKnown, lockTenantRow, registerTenant } from '../db/tenant.js';
import { CairnError, messageOf, UnavailableError } from '../errors.js';
import { objectWith, opt, optionsSchema, parseOptions } from '../options.js';
import { type KeyProvider, keyUnavailable, open, seal } from './keyProvider.js';
import { refusedByProvider } from './providerRefusal.js';

export interface Sealed {
  keyId: string;
  bytes: Buffer;
}

/**
 * Per-tenant data keys (AES-256), stored wrapped by a KEK of the KeyProvider in tenant_key.
 * Payloads are encrypted with the tenant's newest data key; the key id is stored beside
 * each ciphertext. Rotation of the KEK rewraps data keys and leaves payloads alone; shredding
 * deletes a tenant's data keys, after which its ciphertext can never be read.
 */
export interface TenantKeys {
  /** Registers the tenant (if new) and gives it a data key (if it has none). Owner connection. */
  addTenant(tenantId: string): Promise<{ keyId: string; created: boolean }>;
  /** Encrypts `plaintext` under the tenant's current data key, bound to `aad`. */
  seal(tenantId: string, plaintext: Buffer, aad: string, ex?: Executor): Promise<Sealed>;
  /** Decrypts what seal() returned, with the key it names (refused for another tenant's key). */
  open(tenantId: string, keyId: string, bytes: Buffer, aad: string, ex?: Executor): Promise<Buffer>;
  /** Rewraps every data key not under the provider's current KEK; returns how many. */
  rewrapAll(): Promise<{ rewrapped: number; kekId: string }>;
  /** Deletes the tenant's data keys (crypto-shredding); returns how many. Owner connection. */
  shred(tenantId: string): Promise<number>;
}

/** What createTenantKeys takes: the owner's database and the provider that wraps data keys. */
export interface TenantKeysOptions {
  db: Db;
  provider: KeyProvider;
}

const TenantKeysOptionsSchema = optionsSchema<TenantKeysOptions>()(
  z.strictObject({
    db: opt.db(),
    provider: objectWith<KeyProvider>('a KeyProvider (localKeyring())', 'currentKekId', 'wrap', 'unwrap'),
  }),
);

/**
 * The provider's calls with their failures told apart: an error of Cairn's (a key not in the
 * keyring, a wrapped key that does not open) says what is wrong; anything else is an
 * UnavailableError, retriable, never taken for corruption (an inbox handler waits for it
 * instead of spending its message's attempts). Its `refused` says whether the provider
 * answered and said no (access denied, a disabled key: refusedByProvider) or did not answer
 * (a KMS out of reach, the network): past its bound the inbox consumer gives a refused
 * message up, and waits out an outage nothing else gets through.
 * An unwrap that fails authentication (a provider of one's own built on Cairn's ciphertext) is
 * `key_unavailable`: only a payload's own authentication failure is corruption.
 */
function outagesNamed(p: KeyProvider): KeyProvider {
  /** Calls the provider answered: what a waiting inbox consumer goes by (UnavailableError.answers). */
  let answered = 0;
  const answers = () => answered;
  const call = async <T>(what: string, f: () => Promise<T>, subject?: string): Promise<T> => {
    try {
      const r = await f();
      answered++;
      return r;
    } catch (err) {
      if (err instanceof CairnError) throw err;
      if (refusedByProvider(err)) {
        throw new UnavailableError(
          `the key provider refused (${what}): ${messageOf(err)}; check that the key is enabled and that this process may use it`,
          err,
          { refused: true, answers, ...(subject !== undefined ? { subject } : {}) },
        );
      }
      throw new UnavailableError(`the key provider did not answer (${what}): ${messageOf(err)}`, err, {
        answers,
      });
    }
  };
  return {
    currentKekId: () => call('current key id', () => p.currentKekId()),
    wrap: (id, key, context) => call(`wrap ${context} under ${id}`, () => p.wrap(id, key, context), context),
    unwrap: (id, wrapped, context) =>
      call(`unwrap ${context} under ${id}`, () => p.unwrap(id, wrapped, context), context).catch(
        (err: unknown) => {
          if (err instanceof CairnError && err.code === 'decryption_failed')
            throw keyUnavailable(`key-encryption key ${id}`, context, err);
          throw err;
        },
      ),
  };
}

/**
 * Makes TenantKeys: per-tenant data keys stored wrapped in the database and unwrapped by
 * the provider (cached in memory). It holds no connection of its own.
 */
export function createTenantKeys(options: TenantKeysOptions): TenantKeys {
  const parsed = parseOptions('tenant keys options', TenantKeysOptionsSchema, options);
  const { db } = parsed;
  const provider = outagesNamed(parsed.provider);
  const unwrapped = new Map<string, { tenantId: string; key: Buffer }>();

  async function keyById(keyId: string, tenantId: string, ex: Executor): Promise<Buffer> {
    // The row is read every time (a primary-key lookup): a key shredded by another process
    // stops working here at once. Only the unwrapping (a KMS call in production) is cached.
    const row = await ex
      .selectFrom('tenant_key')
      .select(['tenant_id', 'kek_id', 'wrapped_key'])
      .where('key_id', '=', keyId)
      .executeTakeFirst();
    if (!row) {
      throw new CairnError(
        'key_missing',
        `data key ${keyId} of tenant ${tenantId} does not exist (shredded, or not visible to this tenant): the data it encrypted cannot be read`,
      );
    }
    if (row.tenant_id !== tenantId) throw wrongTenant(keyId, row.tenant_id, tenantId);
    const cacheKey = `${keyId}/${row.kek_id}`;
    const cached = unwrapped.get(cacheKey);
    if (cached) return cached.key;
    const key = await provider.unwrap(row.kek_id, row.wrapped_key, `${row.tenant_id}/${keyId}`);
    unwrapped.set(cacheKey, { tenantId, key });
    return key;
  }

  async function currentKey(tenantId: string, ex: Executor): Promise<{ keyId: string; key: Buffer }> {
    const row = await ex
      .selectFrom('tenant_key')
      .select('key_id')
      .where('tenant_id', '=', tenantId)
      .orderBy('created_at', 'desc')
      .limit(1)
      .executeTakeFirst();
    if (!row) {
      await assertTenantKnown(ex, tenantId);
      throw new CairnError(
        'key_missing',
        `tenant ${tenantId} has no data key (shredded?): nothing can be encrypted for it; \`cairn tenant add ${tenantId}\` makes a new one`,
      );
    }
    return { keyId: row.key_id, key: await keyById(row.key_id, tenantId, ex) };
  }

  return {
    async addTenant(tenantId) {
      assertTenantId(tenantId);
      return db.transaction().execute(async (trx) => {
        await registerTenant(trx, tenantId);
        const existing = await trx
          .selectFrom('tenant_key')
          .select('key_id')
          .where('tenant_id', '=', tenantId)
          .limit(1)
          .executeTakeFirst();
        if (existing) return { keyId: existing.key_id, created: false };
        const keyId = `dk-${randomUUID()}`;
        const kekId = await provider.currentKekId();
        const dataKey = randomBytes(32);
        await trx
          .insertInto('tenant_key')
          .values({
            key_id: keyId,
            tenant_id: tenantId,
            kek_id: kekId,
            wrapped_key: await provider.wrap(kekId, dataKey, `${tenantId}/${keyId}`),
          })
          .execute();
        return { keyId, created: true };
      });
    },

    async seal(tenantId, plaintext, aad, ex = db) {
      const { keyId, key } = await currentKey(tenantId, ex);
      return { keyId, bytes: seal(key, plaintext, aad) };
    },

    async open(tenantId, keyId, bytes, aad, ex = db) {
      return open(
        await keyById(keyId, tenantId, ex),
        bytes,
        aad,
        `ciphertext of tenant ${tenantId} (key ${keyId})`,
      );
    },

    async rewrapAll() {
      const kekId = await provider.currentKekId();
      const rows = await db
        .selectFrom('tenant_key')
        .select(['key_id', 'tenant_id', 'kek_id', 'wrapped_key'])
        .where('kek_id', '<>', kekId)
        .execute();
      let rewrapped = 0;
      for (const r of rows) {
        const context = `${r.tenant_id}/${r.key_id}`;
        const dataKey = await provider.unwrap(r.kek_id, r.wrapped_key, context);
        const n = await db
          .updateTable('tenant_key')
          .set({
            kek_id: kekId,
            wrapped_key: await provider.wrap(kekId, dataKey, context),
            rewrapped_at: new Date(),
          })
          .where('key_id', '=', r.key_id)
          .where('kek_id', '=', r.kek_id)
          .executeTakeFirst();
        rewrapped += Number(n.numUpdatedRows);
      }
      return { rewrapped, kekId };
    },

    async shred(tenantId) {
      assertTenantId(tenantId);
      // Not while a legal hold names the tenant or one of its tasks (the keys' trigger, CN008):
      // the tenant's row, locked as placeHold locks it, orders a hold being placed and a shred.
      const r = await db.transaction().execute(async (trx) => {
        await lockTenantRow(trx, tenantId, 'holding');
        return trx.deleteFrom('tenant_key').where('tenant_id', '=', tenantId).executeTakeFirst();
      });
      for (const [id, k] of unwrapped) if (k.tenantId === tenantId) unwrapped.delete(id);
      return Number(r.numDeletedRows);
    },
  };
}

function wrongTenant(keyId: string, owner: string, asked: string): CairnError {
  return new CairnError(
    'wrong_tenant_key',
    `data key ${keyId} belongs to tenant ${owner}, not ${asked}: refusing to decrypt; nothing was returned`,
  );
}

/**
 * Whether the tenant has a data key (any, visible to this executor's role). A key_missing with
 * one means this process cannot unwrap it (its keyring lacks the key-encryption key): an outage
 * of configuration, never "this tenant encrypts nothing".
 */
export async function hasDataKey(ex: Executor, tenantId: string): Promise<boolean> {
  const r = await sql<{
    one: number;
  }>`SELECT 1 AS one FROM tenant_key WHERE tenant_id = ${tenantId} LIMIT 1`.execute(ex);
  return r.rows.length > 0;
}
