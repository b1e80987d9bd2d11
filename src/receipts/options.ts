import { z } from 'zod';
import type { Checkpointer } from '../checkpoints/checkpoints.js';
import type { TenantKeys } from '../crypto/tenantKeys.js';
import { objectWith, opt, optionsSchema } from '../options.js';
import type { ReceiptStoreOptions } from './types.js';

/** What createReceiptStore accepts, checked once: an unknown key or a bad value is a ValidationError naming it. */
export const ReceiptStoreOptionsSchema = optionsSchema<ReceiptStoreOptions>()(
  z.strictObject({
    db: opt.db(),
    logger: opt.logger(),
    worker: opt.text().optional(),
    abandonAfterMs: opt.ms().optional(),
    checkpointer: objectWith<Checkpointer>(
      'a Checkpointer (createCheckpointer())',
      'take',
      'verify',
    ).optional(),
    keys: objectWith<TenantKeys>('TenantKeys (createTenantKeys())', 'seal', 'open').optional(),
  }),
);
