import { type Checkpointer, createCheckpointer } from '../src/checkpoints/checkpoints.js';
import type { KeyRing } from '../src/checkpoints/signing.js';
import { localKeyring } from '../src/crypto/keyProvider.js';
import { createTenantKeys, type TenantKeys } from '../src/crypto/tenantKeys.js';
import type { Db } from '../src/db/database.js';
import { ValidationError } from '../src/errors.js';

/**
 * The keys an operator's command needs to read and check checkpoints, from the environment:
 * CAIRN_CHECKPOINT_KEYS=kid:secret,... (the signing key ring, current first) and
 * CAIRN_KEYRING (or --keyring): the KEK file that unwraps tenants' data keys, without which
 * an encrypted snapshot cannot be read. A command built without them would take every
 * encrypted checkpoint for corrupt: that is an outage of configuration, not of the data.
 */
export function checkpointKeysFromEnv(
  db: Db,
  keyringFile?: string,
): { keyRing?: KeyRing; keys?: TenantKeys } {
  const entries = (process.env.CAIRN_CHECKPOINT_KEYS ?? '').split(',').filter(Boolean);
  for (const e of entries) {
    if (!/^[A-Za-z0-9_.-]+:.+$/.test(e)) {
      throw new ValidationError('CAIRN_CHECKPOINT_KEYS', [
        {
          path: 'CAIRN_CHECKPOINT_KEYS',
          message: 'must be kid:secret,... (current key first); a key id is A-Z a-z 0-9 _ . -',
        },
      ]);
    }
  }
  const keyRing = entries.length
    ? {
        current: entries[0]!.split(':')[0]!,
        keys: Object.fromEntries(
          entries.map((k) => [k.split(':')[0]!, Buffer.from(k.split(':').slice(1).join(':'))]),
        ),
      }
    : undefined;
  const file = keyringFile ?? process.env.CAIRN_KEYRING;
  const keys = file ? createTenantKeys({ db, provider: localKeyring(file) }) : undefined;
  return { ...(keyRing ? { keyRing } : {}), ...(keys ? { keys } : {}) };
}

export function checkpointerFromEnv(
  db: Db,
  keyringFile?: string,
): { checkpointer: Checkpointer; keys?: TenantKeys } {
  const k = checkpointKeysFromEnv(db, keyringFile);
  return { checkpointer: createCheckpointer({ db, ...k }), ...(k.keys ? { keys: k.keys } : {}) };
}
