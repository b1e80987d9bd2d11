import type { ColumnType, Generated, JSONColumnType } from 'kysely';

/** Row types of Cairn's tables, kept beside the migrations that create them. */
export interface TaskStateTable {
  task_id: string;
  tenant_id: string;
  version: number;
  schema_version: string;
  status: string;
  doc: JSONColumnType<Record<string, unknown>>;
  created_at: ColumnType<Date, Date | string | undefined, never>;
  updated_at: ColumnType<Date, Date | string | undefined, Date | string>;
}

export interface TaskAuditTable {
  task_id: string;
  version: number;
  prev_version: number | null;
  tenant_id: string;
  actor: string;
  reason: string | null;
  patch: JSONColumnType<unknown[]>;
  at: Generated<Date>;
}

export interface Database {
  task_state: TaskStateTable;
  task_audit: TaskAuditTable;
}
