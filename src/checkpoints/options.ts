import { z } from 'zod';
import type { TenantKeys } from '../crypto/tenantKeys.js';
import { objectWith, opt, optionsSchema } from '../options.js';
import type { CheckpointerOptions } from './checkpoints.js';
import type { Classification } from './classification.js';
import type { SnapshotStore } from './snapshotStore.js';

/** A signing key ring (KeyRing): the current key's id and every key by id, as Buffers. */
export const KeyRingSchema = z.strictObject({
  current: opt.text(),
  keys: z.record(
    z.string(),
    z.custom<Buffer>((v) => Buffer.isBuffer(v), { message: 'must be a Buffer (the key bytes)' }),
  ),
});

/** What createCheckpointer accepts, checked once: an unknown key or a bad value is a ValidationError naming it. */
export const CheckpointerOptionsSchema = optionsSchema<CheckpointerOptions>()(
  z.strictObject({
    db: opt.db(),
    snapshots: objectWith<SnapshotStore>('a SnapshotStore (put, get)', 'put', 'get').optional(),
    keyRing: KeyRingSchema.optional(),
    keys: objectWith<TenantKeys>('TenantKeys (createTenantKeys())', 'seal', 'open').optional(),
    // Each field's class is checked by validateClassification, which names the bad one.
    classification: z
      .custom<Classification>((v) => typeof v === 'object' && v !== null && !Array.isArray(v), {
        message: 'must be an object of field classes',
      })
      .optional(),
    allowLegacyCheckpoints: z.boolean().optional(),
  }),
);
