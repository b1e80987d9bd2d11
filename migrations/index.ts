import type { Migration, MigrationProvider } from 'kysely';
import * as m0001 from './0001_task_state.js';
import * as m0002 from './0002_outbox.js';
import * as m0003 from './0003_inbox.js';
import * as m0004 from './0004_leases_receipts.js';
import * as m0005 from './0005_checkpoints.js';
import * as m0006 from './0006_tenancy.js';
import * as m0007 from './0007_quarantine.js';
import * as m0008 from './0008_hardening.js';
import * as m0009 from './0009_langgraph.js';
import * as m0010 from './0010_console.js';
import * as m0011 from './0011_inbox_owner_writes.js';
import * as m0012 from './0012_outbox_safe_ids.js';
import * as m0013 from './0013_inbox_tenant_key_partial.js';
import * as m0014 from './0014_cas_batch.js';
import * as m0015 from './0015_tenant_writes.js';
import * as m0016 from './0016_lease_tokens.js';
import * as m0017 from './0017_tenant_rows_bounded.js';
import * as m0018 from './0018_lg_head_reader_marks.js';
import * as m0019 from './0019_outbox_wal_messages.js';
import * as m0020 from './0020_receipt_times.js';

/**
 * Every migration, in order. Imported statically (not read from the folder) so the same
 * list works from TypeScript sources and from the compiled `dist/`. Forward-only: never
 * edit a migration that has landed; add the next number.
 */
export const migrations: Record<string, Migration> = {
  '0001_task_state': m0001,
  '0002_outbox': m0002,
  '0003_inbox': m0003,
  '0004_leases_receipts': m0004,
  '0005_checkpoints': m0005,
  '0006_tenancy': m0006,
  '0007_quarantine': m0007,
  '0008_hardening': m0008,
  '0009_langgraph': m0009,
  '0010_console': m0010,
  '0011_inbox_owner_writes': m0011,
  '0012_outbox_safe_ids': m0012,
  '0013_inbox_tenant_key_partial': m0013,
  '0014_cas_batch': m0014,
  '0015_tenant_writes': m0015,
  '0016_lease_tokens': m0016,
  '0017_tenant_rows_bounded': m0017,
  '0018_lg_head_reader_marks': m0018,
  '0019_outbox_wal_messages': m0019,
  '0020_receipt_times': m0020,
};

export const migrationProvider: MigrationProvider = {
  async getMigrations() {
    return migrations;
  },
};
